"""The window's settings: what they are, where they live (QSettings in the data folder), and the engine objects
they describe (the model pair to load, the decoding strategy, the sampling parameters).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QSettings

from app.theme import THEMES
from core import paths
from core.auto import Auto
from core.backends.llamacpp import MAX_TREE_LEAVES
from core.drafting import Baseline, Chain, MultiDraft, Tree
from core.memory import Memory
from core.models import BACKENDS, PAIRS
from core.ngram import NGram
from core.sampling import SamplingError, SamplingParams

REGISTRY_PAIRS = tuple(PAIRS)
CUSTOM_PAIR = "custom"
AUTO_DEVICE = "auto"   # a GPU when there is one, else the CPU (core.backends.devices)
MAX_TREE_NODES = MAX_TREE_LEAVES   # a static tree of this many nodes has at most this many leaves, so it fits


class SettingsError(ValueError):
    """A setting that cannot describe a valid strategy, pair or sampling configuration."""


def data_dir() -> Path:
    """The user data folder (history, settings), created if missing; ``SPECLENS_DATA_DIR`` overrides it.

    Raises SettingsError when it cannot be used (a file in its place, no permission to create it).
    """
    folder = paths.data_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingsError(f"the data folder {folder} cannot be used: {exc.strerror or exc}. Set SPECLENS_DATA_DIR "
                            "to a folder you can write to.") from None
    if not folder.is_dir():
        raise SettingsError(f"the data folder {folder} is not a folder. Set SPECLENS_DATA_DIR to a folder.")
    return folder


def available_devices() -> list[str]:
    """Devices the engine can run on here: auto (a GPU when present), the CPU, and CUDA when torch sees a GPU."""
    import torch

    return [AUTO_DEVICE, "cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@dataclass(frozen=True)
class PairChoice:
    """Which model pair to load: a registry name, or a custom target/draft pair of GGUF files or model folders."""

    name: str
    backend: str
    device: str | None   # None: a GPU when there is one, else the CPU
    target_path: str = ""
    draft_path: str = ""
    context: int | None = None   # tokens a prompt and its answer may fill (0: all the model was trained with)

    @property
    def label(self) -> str:
        if self.name == CUSTOM_PAIR:
            return f"{Path(self.target_path).name} + {Path(self.draft_path).name}"
        return self.name


@dataclass(frozen=True)
class StrategyOption:
    """One entry of the strategy menu: a key stored in the settings, a label, what builds it, and the settings it
    reads."""

    key: str
    label: str
    build: Callable[["AppSettings"], object]
    help: str
    fields: tuple[str, ...] = ()


def parse_branching(text: str) -> tuple[int, ...]:
    """'2,2,1' -> (2, 2, 1): children per node at each level of a static tree."""
    try:
        widths = tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        raise SettingsError(f"tree branching must be integers separated by commas, like 2,2,1; got {text!r}") from None
    if not widths or any(w < 1 for w in widths):
        raise SettingsError(f"tree branching needs at least one level and every width >= 1; got {text!r}")
    return widths


def branching_parents(widths: tuple[int, ...]) -> tuple[int, ...]:
    """Parent indices, breadth first, of the tree where every node at level l has widths[l] children."""
    parents: list[int] = []
    level = [-1]
    for width in widths:
        nxt = []
        for parent in level:
            for _ in range(width):
                parents.append(parent)
                nxt.append(len(parents) - 1)
        level = nxt
        if len(parents) > MAX_TREE_NODES:
            raise SettingsError(f"this tree has more than {MAX_TREE_NODES} nodes: use smaller widths or fewer levels")
    return tuple(parents)


def _tree(s: "AppSettings") -> Tree:
    widths = parse_branching(s.tree_branching)
    return Tree(branching_parents(widths), name=f"Tree({'x'.join(map(str, widths))})")


def _sequoia(s: "AppSettings") -> Tree:
    return Tree.sequoia(budget=s.tree_budget, max_depth=s.tree_depth)


def strategy_options() -> list[StrategyOption]:
    """The strategies the settings offer, Auto first (the default)."""
    return [
        StrategyOption("auto", "Auto (recommended)", lambda s: Auto(),
                       "Measures this machine once and picks, step by step, what pays: memory drafts (earlier "
                       "text), the draft model's tree, or plain decoding."),
        StrategyOption("baseline", "Baseline (target alone)", lambda s: Baseline(),
                       "The target model alone, one token per call: the reference speed."),
        StrategyOption("chain", "Chain", lambda s: Chain(s.chain_k),
                       "The draft proposes k tokens in a row; the target checks them in one call.", ("chain_k",)),
        StrategyOption("multidraft", "MultiDraft", lambda s: MultiDraft(s.multi_k, s.multi_length),
                       "k independent draft sequences verified together as one tree (SpecTr).",
                       ("multi_k", "multi_length")),
        StrategyOption("tree", "Tree (static shape)", _tree,
                       "A fixed tree: children per node at each level, e.g. 2,2,1 (SpecInfer-style).",
                       ("tree_branching",)),
        StrategyOption("sequoia", "Tree / Sequoia", _sequoia,
                       "The best tree for a node budget and depth (Sequoia dynamic program).",
                       ("tree_budget", "tree_depth")),
        StrategyOption("memory", "Memory", lambda s: Memory(s.ngram_k),
                       "Drafts the continuation of earlier text that matches the latest tokens: this chat, earlier "
                       "chats and earlier answers (no draft model).", ("ngram_k",)),
        StrategyOption("ngram", "N-gram lookup", lambda s: NGram(k=s.ngram_k),
                       "Copies up to k tokens from earlier text when the last tokens match (no draft model).",
                       ("ngram_k",)),
    ]


# The whole numbers a setting may hold: what the settings dialog offers, and all a saved settings.ini may say
RANGES = {"chain_k": (1, 64), "multi_k": (1, 32), "multi_length": (1, 32), "ngram_k": (1, 64),
          "tree_budget": (2, 128), "tree_depth": (1, 32), "top_k": (0, 1_000_000), "seed": (-1, 2**31 - 1),
          "max_new_tokens": (1, 32768), "min_new_tokens": (0, 32768), "serve_port": (1024, 65535),
          "context_size": (0, 1_048_576)}
# the sampling settings SamplingParams checks itself, by the name it gives them
SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "min_p": "min_p"}


@dataclass(frozen=True)
class AppSettings:
    """Everything the settings dialog edits. Persisted field by field in QSettings."""

    pair: str = "default"
    target_path: str = ""
    draft_path: str = ""
    backend: str = "llama.cpp"
    device: str = AUTO_DEVICE
    context_size: int = 4096       # tokens a prompt and its answer may fill; 0: all the model was trained with
    strategy: str = "auto"
    chain_k: int = 4
    multi_k: int = 2
    multi_length: int = 3
    ngram_k: int = 4
    tree_branching: str = "2,2,1"
    tree_budget: int = 16
    tree_depth: int = 6
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0             # llama.cpp's min-p: tokens at least this fraction as likely as the likeliest
    seed: int = -1                 # -1: a fresh random seed for every answer
    max_new_tokens: int = 512
    min_new_tokens: int = 0        # end-of-text is barred before this many tokens (0: off)
    theme: str = "light"
    color_origins: bool = True
    serve_port: int = 8000         # Serve: OpenAI clients reach the chat's models at http://127.0.0.1:PORT/v1
    endpoint_url: str = ""         # another engine's OpenAI-compatible URL, to race (and chat with); its key: app.secrets
    endpoint_model: str = ""
    chat_endpoint: bool = False    # the chat is answered by that endpoint instead of the local models

    def pair_choice(self) -> PairChoice:
        """The model pair these settings ask for."""
        if self.pair not in REGISTRY_PAIRS + (CUSTOM_PAIR,):
            raise SettingsError(f"unknown model pair {self.pair!r}; choose one of {', '.join(REGISTRY_PAIRS)} "
                                "or custom")
        if self.backend not in BACKENDS:
            raise SettingsError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.pair == CUSTOM_PAIR and not (self.target_path and self.draft_path):
            raise SettingsError("a custom pair needs both a target and a draft model (GGUF file or folder)")
        paths = (self.target_path, self.draft_path) if self.pair == CUSTOM_PAIR else ("", "")
        return PairChoice(self.pair, self.backend, None if self.device == AUTO_DEVICE else self.device, *paths,
                          context=self.context_size)

    def sampling(self) -> SamplingParams:
        """The sampling parameters; raises core.sampling.SamplingError on a bad value."""
        return SamplingParams(temperature=float(self.temperature), top_k=int(self.top_k), top_p=float(self.top_p),
                              min_p=float(self.min_p), seed=None if self.seed < 0 else int(self.seed),
                              min_tokens=int(self.min_new_tokens))

    def problems(self) -> list[tuple[tuple[str, ...], str]]:
        """Every reason these settings cannot generate: (the fields at fault, what is wrong, naming their values), none
        when they can.

        Every strategy on offer is checked, not only the chosen one, so that none can fail later on a switch."""
        found: list[tuple[tuple[str, ...], str]] = []
        for name, (lo, hi) in RANGES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                found.append(((name,), f"{name} must be a whole number from {lo} to {hi}, not {value!r}"))
        for name, param in SAMPLING_FIELDS.items():
            try:
                SamplingParams(**{param: getattr(self, name)})
            except SamplingError as exc:
                found.append(((name,), str(exc)))
        for option in strategy_options():
            if all(f not in fields for fields, _ in found for f in option.fields):
                try:
                    option.build(self)
                except (SettingsError, ValueError, TypeError) as exc:
                    found.append((option.fields, f"{option.label}: {exc}"))
        if self.strategy not in {o.key for o in strategy_options()}:
            found.append((("strategy",), f"unknown strategy {self.strategy!r}"))
        try:
            self.pair_choice()
        except SettingsError as exc:
            found.append((("pair", "backend"), str(exc)))
        if self.chat_endpoint and not self.endpoint_url.strip():
            found.append((("chat_endpoint",), "chatting through an endpoint needs its URL"))
        return [(names, ", ".join(f"{n}={getattr(self, n)!r}" for n in names) + f": {reason}")
                for names, reason in found]

    def usable(self, where: str = "") -> tuple["AppSettings", list[str]]:
        """These settings with every field at fault back at its default, and a notice naming each bad value (and
        ``where`` it was read)."""
        notices = []
        settings = self
        for names, problem in self.problems():
            defaults = {n: getattr(AppSettings, n) for n in names}
            good = ", ".join(f"{n}={v!r}" for n, v in defaults.items())
            notices.append(f"A saved setting{where} cannot generate: {problem}. Using {good} instead.")
            settings = replace(settings, **defaults)
        return settings, notices

    def strategy_option(self) -> StrategyOption:
        options = {o.key: o for o in strategy_options()}
        if self.strategy not in options:
            raise SettingsError(f"strategy {self.strategy!r} is not available here; choose one of "
                                f"{', '.join(options)}")
        return options[self.strategy]

    def build_strategy(self):
        """The strategy object; raises SettingsError (or the strategy's ValueError) on bad parameters."""
        try:
            return self.strategy_option().build(self)
        except SettingsError:
            raise
        except (ValueError, TypeError) as exc:
            raise SettingsError(f"{self.strategy_option().label}: {exc}") from exc


def settings_store() -> QSettings:
    """The QSettings file in the data folder (an INI file, so tests and users can find and reset it)."""
    return QSettings(str(data_dir() / "settings.ini"), QSettings.Format.IniFormat)


CHOICES = {"theme": THEMES, "backend": BACKENDS}


def read_settings(**overrides) -> tuple[AppSettings, list[str]]:
    """The saved settings (defaults for anything missing or unusable) with ``overrides`` applied on top, and a
    notice for every saved value that was not usable."""
    store = settings_store()
    values, notices = {}, []
    for f in fields(AppSettings):
        default = f.default
        raw = store.value(f.name)
        if raw is None:
            continue
        try:
            if isinstance(default, bool):
                value = raw if isinstance(raw, bool) else str(raw).lower() == "true"
            else:
                value = type(default)(raw)
            if value not in CHOICES.get(f.name, (value,)):
                raise ValueError(f"not one of {', '.join(CHOICES[f.name])}")
            values[f.name] = value
        except (TypeError, ValueError) as exc:
            notices.append(f"The saved setting {f.name}={raw!r} in {store.fileName()} is not usable ({exc}); "
                           f"using {default!r}.")
    settings = replace(AppSettings(**values), **{k: v for k, v in overrides.items() if v is not None})
    settings, unusable = settings.usable(f" in {store.fileName()}")
    return settings, notices + unusable


def load_settings(**overrides) -> AppSettings:
    """The saved settings, as :func:`read_settings` (without its notices)."""
    return read_settings(**overrides)[0]


def save_settings(settings: AppSettings) -> None:
    """Persist every field; SettingsError when the file cannot be written (a read-only settings.ini)."""
    store = settings_store()
    for key, value in asdict(settings).items():
        store.setValue(key, value)
    store.sync()
    if store.status() != QSettings.Status.NoError:
        raise SettingsError(f"could not save the settings to {store.fileName()} (is it read-only?): your changes "
                            "apply until SpecLens closes")
