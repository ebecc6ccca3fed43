"""The settings dialog: model pair, backend, device, strategy, sampling (with a help line per control), theme.

Values are checked by ``AppSettings.problems`` (through the objects they build: SamplingParams, every strategy, the pair
choice), so the rules live in one place; a bad value is shown in the dialog, which stays open.
"""
from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFileDialog,
                               QFormLayout, QFrame, QGridLayout, QGroupBox, QHBoxLayout, QLabel, QLineEdit,
                               QPushButton, QScrollArea, QSpinBox, QStackedWidget, QVBoxLayout, QWidget)

from app.settings import (BACKENDS, CUSTOM_PAIR, RANGES, REGISTRY_PAIRS, AppSettings, available_devices,
                          strategy_options)
from app.secrets import get_key, keyring_available, set_key
from app.theme import THEMES
from core.models import PAIRS
from core.sampling import MAX_TEMPERATURE

WIDTH = 940            # px: two columns of settings with their help lines
SCREEN_MARGIN = 60     # px of the screen left for the title bar and the panel
PAIR_LABELS = {"default": "Default: Qwen2.5-Coder 1.5B + 0.5B", "tiny": "Tiny random pair (tests, demos)",
               CUSTOM_PAIR: "Custom: choose two models…"}


def _help(text: str) -> QLabel:
    label = QLabel(text)
    label.setObjectName("HelpLine")
    label.setWordWrap(True)
    return label


def _spin(name: str, value: int, special: str = "") -> QSpinBox:
    """A spin box over the range the setting ``name`` may hold."""
    box = QSpinBox()
    box.setRange(*RANGES[name])
    box.setValue(value)
    if special:
        box.setSpecialValueText(special)
    return box


def _dspin(lo: float, hi: float, step: float, decimals: int, value: float) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(lo, hi)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    box.setValue(value)
    return box


class SettingsDialog(QDialog):
    """Edits an AppSettings; ``result_settings`` holds the accepted values."""

    def __init__(self, settings: AppSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("SpecLens settings")
        self.setObjectName("SettingsDialog")
        self.result_settings: AppSettings | None = None
        self.key_notice = ""
        self._initial = settings
        grid = QGridLayout()
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(14)
        grid.addWidget(self._model_group(settings), 0, 0)
        grid.addWidget(self._appearance_group(settings), 1, 0)
        grid.addWidget(self._strategy_group(settings), 0, 1)
        grid.addWidget(self._sampling_group(settings), 1, 1)
        grid.addWidget(self._endpoint_group(settings), 2, 0, 1, 2)
        grid.setColumnStretch(0, 1)
        grid.setColumnStretch(1, 1)

        self.error_label = QLabel()
        self.error_label.setObjectName("ErrorLine")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #d32f2f; font-weight: bold;")
        self.error_label.setVisible(False)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setObjectName("PrimaryButton")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        content = QWidget()
        content.setLayout(grid)
        self.scroll = QScrollArea()     # on a screen shorter than the settings, they scroll; OK stays in view
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setWidget(content)
        self.buttons = buttons
        outer = QVBoxLayout(self)
        outer.addWidget(self.scroll)
        outer.addWidget(self.error_label)
        outer.addWidget(buttons)
        self._pair_changed()
        self._strategy_changed()
        self.setMinimumWidth(WIDTH)
        screen = self.screen().availableGeometry().height() - SCREEN_MARGIN
        self.resize(WIDTH, min(self.whole_height(), screen))

    def whole_height(self) -> int:
        """The height that shows every setting with each wrapped help line whole, nothing scrolled."""
        outer = self.layout()
        margins = outer.contentsMargins()
        content = self.scroll.widget().heightForWidth(WIDTH - margins.left() - margins.right())
        return content + outer.spacing() + self.buttons.sizeHint().height() + margins.top() + margins.bottom()

    # groups
    def _model_group(self, s: AppSettings) -> QGroupBox:
        box = QGroupBox("Model pair")
        form = QFormLayout(box)
        self.pair_combo = QComboBox()
        for key in REGISTRY_PAIRS + (CUSTOM_PAIR,):
            self.pair_combo.addItem(PAIR_LABELS.get(key) or PAIRS[key].description, key)
        self.pair_combo.setCurrentIndex(max(0, self.pair_combo.findData(s.pair)))
        self.pair_combo.currentIndexChanged.connect(self._pair_changed)
        form.addRow("Pair", self.pair_combo)
        form.addRow(_help("The target decides every token; the draft only proposes. Both must share a tokenizer."))
        self.target_edit, target_row = self._path_row(s.target_path, "target")
        self.draft_edit, draft_row = self._path_row(s.draft_path, "draft")
        self.custom_rows = QWidget()
        custom = QFormLayout(self.custom_rows)
        custom.setContentsMargins(0, 0, 0, 0)
        custom.addRow("Target", target_row)
        custom.addRow("Draft", draft_row)
        custom.addRow(_help("A GGUF file (llama.cpp) or a transformers model folder (hf) for each."))
        form.addRow(self.custom_rows)
        self.backend_combo = QComboBox()
        self.backend_combo.addItems(list(BACKENDS))
        self.backend_combo.setCurrentText(s.backend)
        form.addRow("Backend", self.backend_combo)
        form.addRow(_help("llama.cpp runs GGUF files fast on CPU; hf runs PyTorch models (the tiny pair needs hf)."))
        self.device_combo = QComboBox()
        self.device_combo.addItems(available_devices())
        self.device_combo.setCurrentText(s.device)
        form.addRow("Device", self.device_combo)
        form.addRow(_help("Where both models run. CUDA appears when PyTorch sees a GPU."))
        self.context = _spin("context_size", s.context_size, "model's own")
        self.context.setSingleStep(1024)
        form.addRow("Context", self.context)
        form.addRow(_help("Tokens a prompt and its answer may fill: a long file to edit needs more (memory grows with "
                          "it). Model's own: all it was trained with."))
        return box

    def _path_row(self, value: str, role: str) -> tuple[QLineEdit, QWidget]:
        edit = QLineEdit(value)
        edit.setPlaceholderText(f"{role} model: .gguf file or folder")
        row = QWidget()
        layout = QHBoxLayout(row)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(edit, 1)
        file_button = QPushButton("File…")
        file_button.clicked.connect(lambda: self._choose(edit, folder=False))
        folder_button = QPushButton("Folder…")
        folder_button.clicked.connect(lambda: self._choose(edit, folder=True))
        layout.addWidget(file_button)
        layout.addWidget(folder_button)
        return edit, row

    def _choose(self, edit: QLineEdit, folder: bool) -> None:
        if folder:
            path = QFileDialog.getExistingDirectory(self, "Choose a model folder", edit.text())
        else:
            path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", edit.text(), "GGUF models (*.gguf)")
        if path:
            edit.setText(path)

    def _strategy_group(self, s: AppSettings) -> QGroupBox:
        box = QGroupBox("Decoding strategy")
        layout = QVBoxLayout(box)
        self.options = strategy_options()
        self.strategy_combo = QComboBox()
        for option in self.options:
            self.strategy_combo.addItem(option.label, option.key)
        self.strategy_combo.setCurrentIndex(max(0, self.strategy_combo.findData(s.strategy)))
        self.strategy_combo.currentIndexChanged.connect(self._strategy_changed)
        layout.addWidget(self.strategy_combo)
        self.strategy_help = _help("")
        layout.addWidget(self.strategy_help)

        self.chain_k = _spin("chain_k", s.chain_k)
        self.multi_k = _spin("multi_k", s.multi_k)
        self.multi_length = _spin("multi_length", s.multi_length)
        self.ngram_k = _spin("ngram_k", s.ngram_k)
        self.tree_branching = QLineEdit(s.tree_branching)
        self.tree_budget = _spin("tree_budget", s.tree_budget)
        self.tree_depth = _spin("tree_depth", s.tree_depth)
        pages = {
            "chain": [("Draft length k", self.chain_k,
                       "Tokens drafted per step; longer pays only when most are kept.")],
            "multidraft": [("Sequences k", self.multi_k, "Independent drafts verified together."),
                           ("Length", self.multi_length, "Tokens in each draft sequence.")],
            "ngram": [("Lookup length k", self.ngram_k, "Most tokens copied per step from a matching earlier text.")],
            "tree": [("Children per level", self.tree_branching,
                      "Comma-separated widths from the root down: 2,2,1 has 2+4+4 = 10 nodes.")],
            "sequoia": [("Node budget", self.tree_budget, "Tokens the target checks per call, the root included."),
                        ("Max depth", self.tree_depth, "The longest draft path in the tree.")],
        }
        self.strategy_pages = QStackedWidget()
        self._page_index: dict[str, int] = {}
        empty = QWidget()
        self.strategy_pages.addWidget(empty)
        for key, rows in pages.items():
            page = QWidget()
            form = QFormLayout(page)
            form.setContentsMargins(0, 4, 0, 0)
            for label, widget, help_text in rows:
                form.addRow(label, widget)
                form.addRow(_help(help_text))
            self._page_index[key] = self.strategy_pages.addWidget(page)
        layout.addWidget(self.strategy_pages)
        layout.addStretch(1)
        return box

    def _sampling_group(self, s: AppSettings) -> QGroupBox:
        box = QGroupBox("Sampling")
        form = QFormLayout(box)
        self.temperature = _dspin(0.0, MAX_TEMPERATURE, 0.1, 2, s.temperature)
        self.top_k = _spin("top_k", s.top_k, "off")
        self.top_p = _dspin(0.0, 1.0, 0.05, 3, s.top_p)
        self.min_p = _dspin(0.0, 0.99, 0.01, 3, s.min_p)
        self.seed = _spin("seed", s.seed, "random")
        self.max_new = _spin("max_new_tokens", s.max_new_tokens)
        self.min_new = _spin("min_new_tokens", s.min_new_tokens, "off")
        rows = [
            ("Temperature", self.temperature, "0 is greedy (the same answer every time); higher is more varied."),
            ("Top-k", self.top_k, "Sample only among the k most likely tokens (off: all tokens)."),
            ("Top-p", self.top_p, "Sample from the fewest tokens whose probabilities add up to p (1: off)."),
            ("Min-p", self.min_p, "Sample only among tokens at least p times as likely as the likeliest, as llama.cpp "
             "does (0: off)."),
            ("Seed", self.seed, "Repeats a sampled answer exactly (random: new draws each time)."),
            ("Max new tokens", self.max_new, "The answer stops after this many tokens."),
            ("Min new tokens", self.min_new, "End-of-text is barred before this many tokens: answers of a known "
             "length, for timing (off: the model ends when it likes)."),
        ]
        for label, widget, help_text in rows:
            form.addRow(label, widget)
            form.addRow(_help(help_text))
        return box

    def _appearance_group(self, s: AppSettings) -> QGroupBox:
        box = QGroupBox("Appearance and serving")
        form = QFormLayout(box)
        self.theme_combo = QComboBox()
        self.theme_combo.addItems(list(THEMES))
        self.theme_combo.setCurrentText(s.theme)
        form.addRow("Theme", self.theme_combo)
        self.origins_check = QCheckBox("Highlight accepted draft tokens")
        self.origins_check.setChecked(s.color_origins)
        form.addRow("Tokens", self.origins_check)
        form.addRow(_help("Tinted text came from the draft model and was accepted by the target; plain text is the "
                          "target's own token (a correction or the bonus token)."))
        self.serve_port = _spin("serve_port", s.serve_port)
        form.addRow("Serve port", self.serve_port)
        form.addRow(_help("With Serve on (toolbar), editors and OpenAI clients use these models at "
                          "http://127.0.0.1:PORT/v1, with Predicted Outputs; this machine only."))
        return box

    def _endpoint_group(self, s: AppSettings) -> QGroupBox:
        box = QGroupBox("Another server (an OpenAI-compatible endpoint)")
        form = QFormLayout(box)
        self.endpoint_url = QLineEdit(s.endpoint_url)
        self.endpoint_url.setPlaceholderText("http://127.0.0.1:8080/v1 (llama-server, vLLM, SGLang, another SpecLens)")
        form.addRow("URL", self.endpoint_url)
        self.endpoint_key = QLineEdit(get_key(s.endpoint_url) if s.endpoint_url else "")
        self.endpoint_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.endpoint_key.setPlaceholderText("API key, if it needs one")
        form.addRow("API key", self.endpoint_key)
        row = QWidget()
        models = QHBoxLayout(row)
        models.setContentsMargins(0, 0, 0, 0)
        self.endpoint_model = QComboBox()
        self.endpoint_model.setEditable(True)
        self.endpoint_model.setCurrentText(s.endpoint_model)
        models.addWidget(self.endpoint_model, 1)
        self.list_models_button = QPushButton("List models")
        self.list_models_button.clicked.connect(self.list_endpoint_models)
        models.addWidget(self.list_models_button)
        form.addRow("Model", row)
        self.chat_endpoint = QCheckBox("Chat through this server instead of the local models")
        self.chat_endpoint.setChecked(s.chat_endpoint)
        form.addRow("", self.chat_endpoint)
        self.endpoint_help = _help("Race it against SpecLens (toolbar: Race vs server), or chat through it; its "
                                   "speculative statistics are read in its own fields. "
                                   + ("The key goes to the system keyring." if keyring_available() else
                                      "No keyring on this system: the key is kept until SpecLens closes, never "
                                      "written to settings.ini."))
        form.addRow(self.endpoint_help)
        return box

    def list_endpoint_models(self) -> None:
        """Ask the endpoint for its models (and which engine it is)."""
        from core.endpoints.client import Endpoint, EndpointError, probe

        try:
            found = probe(Endpoint(self.endpoint_url.text(), self.endpoint_key.text()))
        except EndpointError as exc:
            self.endpoint_help.setText(str(exc))
            return
        current = self.endpoint_model.currentText()
        self.endpoint_model.clear()
        self.endpoint_model.addItems(found.models)
        self.endpoint_model.setCurrentText(current if current in found.models else found.models[0])
        self.endpoint_help.setText(f"{found.engine} server with {len(found.models)} model(s).")

    # behaviour
    def _pair_changed(self) -> None:
        self.custom_rows.setVisible(self.pair_combo.currentData() == CUSTOM_PAIR)

    def _strategy_changed(self) -> None:
        index = self.strategy_combo.currentIndex()
        option = self.options[index] if index >= 0 else None
        self.strategy_help.setText(option.help if option else "")
        self.strategy_pages.setCurrentIndex(self._page_index.get(option.key if option else "", 0))

    def values(self) -> AppSettings:
        """The settings as currently entered (not yet checked)."""
        return replace(
            self._initial, pair=self.pair_combo.currentData(), target_path=self.target_edit.text().strip(),
            draft_path=self.draft_edit.text().strip(), backend=self.backend_combo.currentText(),
            device=self.device_combo.currentText(), context_size=self.context.value(),
            strategy=self.strategy_combo.currentData(),
            chain_k=self.chain_k.value(), multi_k=self.multi_k.value(), multi_length=self.multi_length.value(),
            ngram_k=self.ngram_k.value(), tree_branching=self.tree_branching.text().strip(),
            tree_budget=self.tree_budget.value(), tree_depth=self.tree_depth.value(),
            temperature=self.temperature.value(), top_k=self.top_k.value(), top_p=self.top_p.value(),
            min_p=self.min_p.value(), seed=self.seed.value(), max_new_tokens=self.max_new.value(),
            min_new_tokens=self.min_new.value(),
            theme=self.theme_combo.currentText(), color_origins=self.origins_check.isChecked(),
            serve_port=self.serve_port.value(), endpoint_url=self.endpoint_url.text().strip(),
            endpoint_model=self.endpoint_model.currentText().strip(), chat_endpoint=self.chat_endpoint.isChecked(),
        )

    def check(self) -> AppSettings | None:
        """The entered settings if they are valid; otherwise None, with the problem shown in the dialog."""
        settings = self.values()
        problems = settings.problems()
        if problems:
            self.error_label.setText(problems[0][1])
            self.error_label.setVisible(True)
            return None
        self.error_label.setVisible(False)
        return settings

    def accept(self) -> None:
        settings = self.check()
        if settings is not None:
            if settings.endpoint_url:
                self.key_notice = f"The endpoint's API key is {set_key(settings.endpoint_url, self.endpoint_key.text())}."
            self.result_settings = settings
            super().accept()
