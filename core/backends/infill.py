"""Fill in the middle: the control tokens with which a code model writes what goes between a prefix and a suffix (an
editor's completion at the cursor, the rest of the file after it), and the prompts built from them.

A request with OpenAI's ``suffix`` becomes ``<prefix> prefix <suffix> suffix <middle>``, and the model's answer is the
middle (the order llama.cpp's ``/infill`` builds by default). llama.cpp's ``/infill`` (:func:`repo_prompt`) adds the
editor's other files before it in the repository-level layout Qwen2.5-Coder was trained on (arXiv 2409.12186), so a
completion can use names defined elsewhere. Models spell the tokens differently; a GGUF may name them, and where it
does not, llama.cpp recognises them by these spellings, as a transformers tokenizer is read here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

SPELLINGS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),         # Qwen2.5-Coder, Qwen3-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),               # StarCoder, StarCoder2
    ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),            # DeepSeek-Coder
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),                                 # CodeLlama
    ("<PRE>", "<SUF>", "<MID>"),
    ("<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"),      # GLM-4
)
REPO_SPELLINGS = ("<|repo_name|>", "<repo_name>", "<reponame>", "<fim-repo>", "<fim_repo>")
FILE_SPELLINGS = ("<|file_sep|>", "<file_sep>", "<|file_separator|>", "<fim-sep>", "<fim_sep>")

# llama-server's placeholders: the editor sends neither the project's name nor the file's, and the same prompt as
# llama-server's gives an editor the same completions from either server
PROJECT = "myproject"
FILENAME = "filename"
SNIPPET = "\n\n--- snippet ---\n\n"    # between extra files, for a model without a file separator token


@dataclass(frozen=True)
class FimTokens:
    """A model's fill-in-the-middle token ids; ``repo`` and ``file_sep`` (None where the model has none) open the
    repository and each file of the repository-level layout; ``bos`` is the begin-of-text token where the model's
    tokenizer adds one (llama-server puts it before the prefix token)."""

    prefix: int
    suffix: int
    middle: int
    repo: int | None = None
    file_sep: int | None = None
    bos: int | None = None

    @property
    def start(self) -> list[int]:
        return [] if self.bos is None else [self.bos]


def spelled(ids: Mapping[str, int], bos: int | None = None) -> FimTokens | None:
    """The tokens of the first spelling whose three tokens are all in the vocabulary ``ids`` (token text -> id), with
    its repository and file tokens where it has them and ``bos``; None when it has no spelling of the three."""
    for names in SPELLINGS:
        if all(name in ids for name in names):
            repo = next((ids[n] for n in REPO_SPELLINGS if n in ids), None)
            file_sep = next((ids[n] for n in FILE_SPELLINGS if n in ids), None)
            return FimTokens(ids[names[0]], ids[names[1]], ids[names[2]], repo, file_sep, bos)
    return None


def infill_prompt(tokens: FimTokens, prefix: Sequence[int], suffix: Sequence[int]) -> list[int]:
    """The prompt whose answer is the middle between ``prefix`` and ``suffix`` (token ids)."""
    return [*tokens.start, tokens.prefix, *prefix, tokens.suffix, *suffix, tokens.middle]


@dataclass(frozen=True)
class Budget:
    """How much of each part a repository-level prompt keeps, in tokens: the end of the prefix (``window`` * 3/4), the
    start of the suffix (the rest of ``window``, less what the user typed on the cursor's line) and the end of the
    extra files (``extra``), as llama-server cuts them with its batch size as the window."""

    window: int
    extra: int

    def __post_init__(self) -> None:
        if self.window < 4 or self.extra < 0:
            raise ValueError(f"a fill-in-the-middle budget needs a window of 4 tokens or more, got {self}")

    @property
    def prefix(self) -> int:
        return 3 * (self.window // 4)

    def suffix(self, typed: int) -> int:
        return max(0, self.window // 4 - (2 + typed))


def repo_prompt(tokens: FimTokens, tokenize: Callable[[str], list[int]], prefix: str, suffix: str, typed: str,
                extra: Sequence[tuple[str, str]], budget: Budget) -> list[int]:
    """llama.cpp's ``/infill`` prompt: the ``extra`` files ((filename, text), the editor's other context) under the
    repository token, then (after the model's begin-of-text token, where it has one) ``<prefix> prefix typed
    <suffix> suffix <middle>``; ``typed`` is the cursor's line up to
    the cursor. Each part is cut to ``budget``: the prefix and the extra files keep their ends (nearest the cursor),
    the suffix its start."""
    files: list[int] = []
    if tokens.repo is not None:
        files += [tokens.repo, *tokenize(PROJECT + "\n")]
    for filename, text in extra:
        files += [tokens.file_sep, *tokenize(filename + "\n")] if tokens.file_sep is not None else tokenize(SNIPPET)
        files += tokenize(text)
    if tokens.file_sep is not None:
        files += [tokens.file_sep, *tokenize(FILENAME + "\n")]
    typed_ids = tokenize(typed)
    before = tokenize(prefix)[-budget.prefix:]
    after = tokenize(suffix)[:budget.suffix(len(typed_ids))]
    kept = files[len(files) - min(budget.extra, len(files)):]
    return [*kept, *tokens.start, tokens.prefix, *before, *typed_ids, tokens.suffix, *after, tokens.middle]
