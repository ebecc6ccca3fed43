"""ChatSession: the chat without its window — conversation, history writes, models, warm-up and the live answer.

The window only wires widgets to this object's signals and calls its methods; tests drive it directly. All engine
work (loading, warming, tokenising and templating the chat, decoding) runs on worker threads (app.worker), whose
output reaches this object at frame rate as immutable data. One guard, :meth:`_is_live`, makes sure a stopped or
replaced answer's late output never touches the current one.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.chat.history import Conversation, HistoryError, HistoryStore, Message, storable
from app.chat.origins import origin_codes
from app.chat.stats import stats_record
from app.endpoint_chat import EngineReport, endpoint_job, endpoint_of
from app.history_writer import HistoryWriter
from app.model_host import ModelHost
from app.settings import AppSettings, SettingsError, save_settings
from app.worker import EngineRun
from core.context import fit_chat
from core.divergence import compare_greedy
from core.engine import SpeculativeEngine
from core.events import GenerationResult, StepEvent, StopReason

log = logging.getLogger(__name__)

TITLE_CHARS = 48
CLOSE_WAIT_MS = 2500   # a prefill chunk or a step ends well within this, so closing never hangs
# how long reading the history (opening a chat, exporting) waits for this window's own queued writes: they take
# milliseconds unless another program holds the file, and the window must not freeze meanwhile
READ_WAIT_S = 0.1
HISTORY_BUSY = ("The chat history is still saving (another program holds the file); try again in a moment — "
                "nothing is lost")
BUSY_REASON = "Cannot do this while the model is generating: press Stop (Esc) first"


@dataclass(frozen=True)
class PromptFitted:
    """Pushed by an answer's job before decoding: the prompt as sent, and how many messages were left out."""

    ids: tuple[int, ...]
    dropped: int
    start: int


@dataclass(frozen=True)
class PrefillProgress:
    done: int
    total: int


@dataclass(frozen=True)
class _Answered:
    """A finished answer as decoded: what a greedy regeneration of it is compared with."""

    message: Message
    prompt: tuple[int, ...]
    result: GenerationResult
    greedy: bool


@dataclass
class _Answer:
    """The answer being generated."""

    run: EngineRun
    message: Message
    question: Message          # the user message it answers (removed again if its prompt cannot fit)
    strategy: str
    greedy: bool
    replaced: _Answered | None = None   # the answer this one regenerates, when this session made it
    prompt: tuple[int, ...] = ()
    stopped: bool = False
    engine_report: str = ""    # an endpoint's own account of its speculation


def as_code(text: str) -> str:
    """A text completion's raw prompt (code, most often) as a message shows it: a code block, its lines kept, fenced
    by more backticks than it holds in a row."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


class ChatSession(QObject):
    """See the module docstring."""

    loading = Signal(float, str)          # fraction, what is being done (models, then warm-up)
    models_ready = Signal(str)            # a description of the loaded pair
    models_failed = Signal(str)
    warm = Signal()                       # warm-up done: answers start at full speed
    conversations_changed = Signal(list)  # [Conversation] without messages
    conversation_opened = Signal(object)  # Conversation (with messages) or None for a new chat
    message_added = Signal(object)        # Message appended to the open conversation
    messages_removed = Signal(int)        # messages from this index on were removed
    answer_started = Signal(str)          # the strategy's label
    answer_frame = Signal(object, tuple)  # (the answer Message, the StepEvents since the last frame)
    answer_finished = Signal(object, object)  # (Message or None, GenerationResult or None on failure)
    busy_changed = Signal(bool)
    notice = Signal(str)                  # a line in the chat (e.g. older messages left out)
    status = Signal(str)                  # a passing status-bar line
    error = Signal(str, str)              # title, text: a dialog
    input_returned = Signal(str)          # text given back to the input box (a message that could not be sent)
    unkept_changed = Signal(bool)         # the open conversation is a served request not (yet) kept in the history

    def __init__(self, settings: AppSettings, store: HistoryStore, load=None, persist: bool = True) -> None:
        super().__init__()
        self.settings = settings
        self.store = store
        self._persist = persist
        self.models = ModelHost(load, self)
        self.models.loading.connect(self.loading)
        self.models.ready.connect(self.models_ready)
        self.models.failed.connect(self.models_failed)
        self.models.error.connect(self.error)
        self.models.warm.connect(self.warm)
        self.models.warm.connect(self._on_warm)
        self.conv: Conversation | None = None
        self.answer: _Answer | None = None
        self._queued_send: tuple[str, Message | None] | None = None
        self._starts: dict[int, int] = {}      # conversation id -> first message kept in the prompt (sticky)
        self._closed = False
        self._unsaved = 0                      # negative ids of conversations not (yet) in the history file
        self._last: _Answered | None = None    # the last answer this session finished
        self._unkept: Conversation | None = None   # an opened served request, shown but not in the history
        self.writer = HistoryWriter(store, self)
        self.writer.failed.connect(self.error)
        self.writer.status.connect(self.status)
        self.writer.deleted_elsewhere.connect(self._deleted_elsewhere)
        self.writer.reopened.connect(self._history_reopened)
        self.writer.created.connect(self._conversation_saved)
        self.writer.listed.connect(self.refresh_conversations)

    # -- models ------------------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.answer is not None

    @property
    def ready(self) -> bool:
        return self.models.backends is not None

    @property
    def backends(self) -> tuple | None:
        return self.models.backends

    @property
    def strategy(self):
        return self.models.strategy

    @strategy.setter
    def strategy(self, strategy) -> None:
        # The bench's window surface decodes with the very strategy object its engine run uses.
        self.models.strategy = strategy

    @property
    def is_warm(self) -> bool:
        return self.models.is_warm

    def load_models(self) -> None:
        """Load the pair the settings name on a worker thread, then warm it up; sends wait for both."""
        try:
            self.models.load(self.settings)
        except SettingsError as exc:
            self.error.emit("Model pair", str(exc))

    def _on_warm(self) -> None:
        if self._queued_send is not None:
            text, replacing = self._queued_send
            self._queued_send = None
            if not self.send(text, replacing):
                self.input_returned.emit(text)

    # -- settings ----------------------------------------------------------------------------------------------
    def apply_settings(self, new: AppSettings) -> None:
        """Use ``new`` settings: persist them; reload the models when the pair changed, re-warm when the strategy
        or sampling did."""
        old = self.settings
        self.settings = new
        if self._persist:
            try:
                save_settings(new)
            except SettingsError as exc:
                self.error.emit("Settings", str(exc))
        try:
            reload = new.pair_choice() != old.pair_choice() or (self.backends is None and not self.models.busy)
        except SettingsError as exc:
            self.error.emit("Model pair", str(exc))
            return
        if reload:
            self.stop(wait=True)
            self.load_models()
        elif self.backends is not None and _decoding(new) != _decoding(old):
            self.models.warm_up(new)

    # -- conversations -----------------------------------------------------------------------------------------
    def refresh_conversations(self) -> None:
        try:
            self.conversations_changed.emit(self.store.conversations())
        except HistoryError as exc:
            self.error.emit("Chat history", str(exc))

    def new_chat(self) -> bool:
        if self.busy:
            self.status.emit(BUSY_REASON)
            return False
        self.conv = None
        self._forget_unkept()
        self.conversation_opened.emit(None)
        self.refresh_conversations()
        return True

    def open_served(self, record) -> bool:
        """Show a served request (core.serve.job.ServedRecord) like a chat: its messages and the answer the server
        gave, decoded as it was. It is not in the history unless kept (:meth:`keep_open`, or a message sent in it)."""
        if self.busy:
            self.status.emit(BUSY_REASON)
            return False
        req, finished = record.request, record.finished
        messages = list(req.messages) if req.chat else [{"role": "user", "content": as_code(req.text)}]
        turns = [m for m in messages if m["role"] in ("user", "assistant")] or [{"role": "user", "content": ""}]
        first = ((turns[-1]["content"] if req.chat else req.text).strip().splitlines() or [""])[0]
        self._unsaved -= 1
        conv = Conversation(self._unsaved, storable(f"Served: {first[:TITLE_CHARS]}"),
                            storable("\n".join(m["content"] for m in messages if m["role"] == "system")))
        conv.messages = [Message(m["role"], storable(m["content"])) for m in turns]
        result = finished.result
        origins = "".join(origin_codes(step, 0, len(step.text)) for step in result.steps)[:len(finished.text)]
        answer, origins = finished.text, origins.ljust(len(finished.text))
        if not req.chat:    # the completion of code is code too; its origins move with it into the block
            answer = as_code(finished.text)
            start = answer.index("\n") + 1
            origins = " " * start + origins + " " * (len(answer) - start - len(origins))
        conv.messages.append(Message("assistant", storable(answer), origins,
                                     stats_record(result.stats, result.steps[-1].strategy if result.steps else "",
                                                  result.stop_reason)))
        self.conv, self._unkept = conv, conv
        self.conversation_opened.emit(conv)
        self.unkept_changed.emit(True)
        return True

    def keep_open(self) -> None:
        """Write the open served request into the history as a conversation of its own."""
        conv, self._unkept = self._unkept, None
        if conv is None or conv is not self.conv:
            return
        self.writer.create(conv)
        for message in conv.messages:
            self.writer.run("the message", lambda store, m=message: store.add_message(conv.id, m))
        self.unkept_changed.emit(False)

    def open_conversation(self, conversation_id: int) -> bool:
        if self.busy:
            self.status.emit(BUSY_REASON)
            return False
        if not self.writer.wait(READ_WAIT_S):
            self.status.emit(HISTORY_BUSY)
            return False
        try:
            self.conv = self.store.conversation(conversation_id)
            self._forget_unkept()
        except HistoryError as exc:
            self.error.emit("Chat history", f"Could not open the conversation: {exc}")
            self.refresh_conversations()
            return False
        self.conversation_opened.emit(self.conv)
        return True

    def rename(self, conversation_id: int, title: str) -> None:
        self.writer.run("the new title", lambda store: store.rename(conversation_id, storable(title)), listed=True)
        if self.conv is not None and self.conv.id == conversation_id:
            self.conv.title = title

    def delete(self, conversation_id: int) -> bool:
        """Delete a conversation and its messages (not the one being answered)."""
        if self.busy and self.conv is not None and self.conv.id == conversation_id:
            self.status.emit(BUSY_REASON)
            return False
        self.writer.run("the deletion", lambda store: store.delete(conversation_id), listed=True)
        if self.conv is not None and self.conv.id == conversation_id:
            self.conv = None
            self.conversation_opened.emit(None)
        return True

    def export(self, conversation_id: int, fmt: str, path: Path) -> bool:
        if not self.writer.wait(READ_WAIT_S):
            self.status.emit(HISTORY_BUSY)
            return False
        try:
            (self.store.export_json if fmt == "json" else self.store.export_markdown)(conversation_id, Path(path))
        except (OSError, HistoryError) as exc:
            self.error.emit("Export", f"Could not export to {path}: {exc}")
            return False
        self.status.emit(f"Exported to {path}")
        return True

    def set_system_prompt(self, text: str) -> None:
        if self.conv is not None and text != self.conv.system_prompt:
            conv = self.conv
            conv.system_prompt = text
            if conv is self._unkept:
                return   # written with the rest if the user keeps it
            self.writer.run("the system prompt", lambda store: store.set_system_prompt(conv.id, storable(text)))

    def _deleted_elsewhere(self) -> None:
        if self.conv is not None:
            self.error.emit("Chat history", f"The conversation “{self.conv.title}” was deleted in another window; "
                                            "its messages stay on screen until you switch chats, but no longer save.")
        self.refresh_conversations()

    def _forget_unkept(self) -> None:
        if self._unkept is not None:
            self._unkept = None
            self.unkept_changed.emit(False)

    def _history_reopened(self) -> None:
        """Another window replaced the file with a repaired one: read the new file too."""
        try:
            store = HistoryStore(self.store.path)
        except HistoryError as exc:
            self.error.emit("Chat history", f"Could not reopen the chat history: {exc}")
            return
        self.store.close()
        self.store = store
        if store.notice:
            self.error.emit("Chat history", store.notice)
        self.refresh_conversations()

    def _conversation_saved(self, conv: Conversation, placeholder: int) -> None:
        """A new chat reached the history file: it now has its stored id, and a place in the list."""
        if placeholder in self._starts:
            self._starts[conv.id] = self._starts.pop(placeholder)
        self.refresh_conversations()

    # -- sending -----------------------------------------------------------------------------------------------
    def send(self, text: str, replacing: Message | None = None, system_prompt: str | None = None) -> bool:
        """Send ``text`` as the user's next message (or in place of ``replacing`` and everything after it) and start
        the answer. During warm-up the message waits; before the models load it is refused with a reason."""
        text = storable(text)
        if not text.strip():
            return False
        if self.busy:
            self.status.emit("An answer is being generated: wait for it or press Esc to stop")
            return False
        if self.backends is None:
            self.status.emit("The models are not loaded yet")
            return False
        if not self._can_generate():
            return False
        if not self.is_warm:
            self._queued_send = (text, replacing)
            self.status.emit("Warming up the models: your message is sent as soon as they are ready")
            return True
        if self.conv is None:
            self._new_conversation(text, storable(system_prompt or ""))
        elif self.conv is self._unkept:   # going on with a served request makes it a chat of the user's
            self.keep_open()
        if replacing is not None:
            self._truncate_from(replacing)
        question = Message("user", text)
        self._append(question)
        self.refresh_conversations()
        return self._start_answer(question)

    def _new_conversation(self, text: str, system_prompt: str) -> None:
        """A new chat, at once in the window; in the history file once the writer gets to it (a read-only history
        never holds it: the chat lives in the window only, and the writer says so once)."""
        first_line = text.strip().splitlines()[0]
        title = first_line[:TITLE_CHARS] + ("…" if len(first_line) > TITLE_CHARS else "")
        self._unsaved -= 1
        self.conv = Conversation(self._unsaved, title, system_prompt)
        self.writer.create(self.conv)
        self.conversation_opened.emit(self.conv)

    def regenerate(self) -> bool:
        """Replace the last answer with a new one."""
        if self.busy or self.conv is None or self.backends is None or not self.is_warm:
            return False
        if not self.conv.messages or self.conv.messages[-1].role != "assistant" or not self._can_generate():
            return False
        if self.conv is self._unkept:
            self.keep_open()
        old = self.conv.messages[-1]
        replaced = self._last if self._last is not None and self._last.message is old else None
        self._truncate_from(old)
        return self._start_answer(self.conv.messages[-1], replaced)

    def _append(self, message: Message) -> None:
        conv = self.conv
        conv.messages.append(message)
        self.writer.run("the message", lambda store: store.add_message(conv.id, message))
        self.message_added.emit(message)

    def _truncate_from(self, message: Message) -> None:
        conv = self.conv
        index = next(i for i, m in enumerate(conv.messages) if m is message)
        del conv.messages[index:]

        def write(store: HistoryStore) -> None:
            if message.id is not None:   # None: its own write failed, so there is nothing to delete
                store.delete_messages_from(conv.id, message.id)

        self.writer.run("the edit", write)
        self.messages_removed.emit(index)

    def _can_generate(self) -> bool:
        """Whether the settings can generate; if not, the user is told why (and what was typed stays typed)."""
        problems = self.settings.problems()
        if problems:
            self.error.emit("Settings", f"Cannot generate with these settings: {problems[0][1]}. Nothing was sent: "
                                        "fix the setting (Settings, Ctrl+,) and send again.")
        return not problems

    def _start_answer(self, question: Message, replaced: _Answered | None = None) -> bool:
        sampling = self.settings.sampling()
        target, draft = self.backends
        conv = self.conv
        messages = [{"role": m.role, "content": m.content} for m in conv.messages]
        system, max_new = conv.system_prompt, self.settings.max_new_tokens
        start = self._starts.get(conv.id, 0)
        strategy = self.strategy
        label = strategy.label
        if self.settings.chat_endpoint:
            label = f"endpoint {endpoint_of(self.settings).label}"
            job = endpoint_job(self.settings, target, system, messages, max_new, start, sampling,
                               lambda f: PromptFitted(tuple(f.prompt_ids), f.dropped, f.start))
        else:
            def job(push, cancel):
                # the template and the tokenizer run here, not on the GUI thread
                fitted = fit_chat(system, messages, target.apply_chat_template, target.context_length, max_new,
                                  start)
                push(PromptFitted(tuple(fitted.prompt_ids), fitted.dropped, fitted.start))
                engine = SpeculativeEngine(target, draft, strategy, sampling)
                for event in engine.stream(fitted.prompt_ids, max_new, cancel,
                                           progress=lambda done, total: push(PrefillProgress(done, total))):
                    push(event)
                return engine.last_result
        answer = Message("assistant", "", complete=False)
        self._append(answer)
        run = EngineRun(job, self)
        self.answer = _Answer(run, answer, question, label, sampling.greedy, replaced)
        run.frame.connect(lambda items, r=run: self._on_frame(r, items))
        run.finished.connect(lambda result, r=run: self._on_finished(r, result))
        run.failed.connect(lambda message, r=run: self._on_failed(r, message))
        run.start()
        self.busy_changed.emit(True)
        self.answer_started.emit(label)
        return True

    def stop(self, wait: bool = False) -> None:
        """Stop the answer at the next prefill chunk or step; what was generated is kept (as incomplete)."""
        answer = self.answer
        if answer is None:
            return
        answer.stopped = True
        answer.run.cancel()
        if wait and not answer.run.wait(CLOSE_WAIT_MS):
            log.warning("the answer did not stop within %d ms", CLOSE_WAIT_MS)

    # -- the live answer ---------------------------------------------------------------------------------------
    def _is_live(self, run: EngineRun) -> bool:
        """Whether output of ``run`` may touch the answer: a stopped-and-replaced answer's late output may not."""
        return self.answer is not None and self.answer.run is run and not self._closed

    def _on_frame(self, run: EngineRun, items: tuple) -> None:
        if not self._is_live(run):
            return
        answer = self.answer
        steps = []
        for item in items:
            if isinstance(item, StepEvent):
                steps.append(item)
            elif isinstance(item, PromptFitted):
                answer.prompt = item.ids
                self._starts[self.conv.id] = item.start
                if item.dropped:
                    self.notice.emit(f"The {item.dropped} oldest message{'s' if item.dropped != 1 else ''} of this "
                                     "chat no longer fit in the model's context and were left out of this answer's "
                                     "prompt (they stay in the history).")
            elif isinstance(item, EngineReport):
                answer.engine_report = item.text
            elif isinstance(item, PrefillProgress) and item.total > 256:
                self.status.emit(f"Reading the prompt: {item.done} of {item.total} tokens (Esc stops)")
        if not steps:
            return
        message = answer.message
        for event in steps:
            before = len(message.content)
            message.content += event.text
            message.origins += origin_codes(event, before, len(message.content))
        message.stats = stats_record(steps[-1].stats, answer.strategy, None)
        self.writer.update(message)
        self.answer_frame.emit(message, tuple(steps))

    def _on_finished(self, run: EngineRun, result: GenerationResult) -> None:
        if not self._is_live(run):
            return
        answer = self.answer
        answer.message.stats = stats_record(result.stats, answer.strategy, result.stop_reason)
        if answer.engine_report:
            answer.message.stats["engine_stats"] = answer.engine_report
        answer.message.complete = result.stop_reason != StopReason.CANCELLED
        self.writer.update(answer.message)
        self._compare_with_replaced(answer, result)
        self._last = _Answered(answer.message, answer.prompt, result, answer.greedy)
        self._end(answer, result)

    def _compare_with_replaced(self, answer: _Answer, result: GenerationResult) -> None:
        """A greedy regeneration of the same prompt gives the same tokens, except where a near-tie rounds the other
        way (quantized llama.cpp computes a batch, and a reused prompt cache, with other kernels): say where and
        which it was, as the race and the bench do."""
        replaced = answer.replaced
        if replaced is None or not (answer.greedy and replaced.greedy) or replaced.prompt != answer.prompt:
            return
        comparison = compare_greedy(replaced.result, result)
        if not comparison.identical:
            self.notice.emit(f"This greedy answer parts from the one it replaced: {comparison.describe()}; "
                             f"{comparison.reason}.")

    def _on_failed(self, run: EngineRun, message: str) -> None:
        if not self._is_live(run):
            return
        answer = self.answer
        if answer.message.content:
            self.writer.update(answer.message)
            self._end(answer, None)
        else:  # nothing was generated: neither an empty answer nor its unanswered question is kept
            self.answer = None
            self._truncate_from(answer.question)
            self.input_returned.emit(answer.question.content)
            self.writer.flush()
            self.busy_changed.emit(False)
            self.answer_finished.emit(None, None)
        self.error.emit("Generation failed", message)

    def _end(self, answer: _Answer, result: GenerationResult | None) -> None:
        self.answer = None
        self.writer.flush()
        self.busy_changed.emit(False)
        self.answer_finished.emit(answer.message, result)

    # -- closing -----------------------------------------------------------------------------------------------
    def close(self, save_wait_s: float = CLOSE_WAIT_MS / 1000) -> bool:
        """End cleanly: stop the answer (saved as incomplete) and any load, wait for the threads briefly, write
        everything (waiting up to ``save_wait_s``), close the history. False when writes are still waiting for a lock
        another program holds: they are written if the process lives until the writer's ``saved``, lost if it ends
        first (the window asks the user which). Calling it again only waits for the writes again."""
        if self._closed:
            return self.writer.close(save_wait_s)
        answer = self.answer
        self.stop(wait=True)
        if answer is not None and self.answer is answer:
            answer.message.complete = False
            if answer.message.stats:
                answer.message.stats = {**answer.message.stats, "stop_reason": StopReason.CANCELLED.value}
            self.writer.update(answer.message)
            self.answer = None
        self._closed = True
        self.models.close(CLOSE_WAIT_MS)
        if answer is not None:
            answer.run.wait()   # a thread must not outlive its QThread object
        self.store.close()
        return self.writer.close(save_wait_s)


def _decoding(settings: AppSettings) -> tuple:
    """The settings a warm-up depends on."""
    return replace(settings, theme="", color_origins=True, max_new_tokens=0)
