"""Prompt formats: a record -> segments of text, each marked as prompt (not trained on) or target.

One class per format (`alpaca`, `chat`, `completion`), chosen by name with
`prompter_for`. Segments keep the prompt/response boundary exact, so the
collator can mask prompt tokens whatever the tokenizer does at the seam.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

from llm.data.inputs.errors import InputError
from llm.data.tokenize.foreign import as_tokenizer
from llm.data.tokenize.protocol import Tokenizer

Segment = tuple[str, bool]  # (text, is_target)
log = logging.getLogger(__name__)

ALPACA_TEMPLATE = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_TEMPLATE_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
# The built-in chat layout, used when the tokenizer ships no chat template: one block per message.
CHAT_TEMPLATE = "<|{role}|>\n{content}\n"
_ROLES = ("system", "user", "assistant", "tool")


class RecordError(ValueError):
    """A record that does not fit its prompt format; the message names the field."""


class Prompter(Protocol):
    """Turns one raw record into segments; the collator tokenizes them."""

    name: str
    append_eos: bool  # whether the collator ends the sample with EOS (a chat template writes its own)

    def segments(self, record: dict[str, Any]) -> list[Segment]: ...


def _text(record: dict[str, Any], key: str, required: bool = True) -> str:
    value = record.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        got = "missing" if value is None else f"a {type(value).__name__}"
        raise RecordError(f"record field {key!r} is {got}, expected a string (record keys: {', '.join(sorted(record))})")
    return value


class AlpacaPrompter:
    """`instruction`, optional `input`, `output`: the Stanford Alpaca template; the output is the target."""

    name = "alpaca"
    append_eos = True

    def segments(self, record: dict[str, Any]) -> list[Segment]:
        instruction, extra = _text(record, "instruction"), _text(record, "input", required=False)
        output = _text(record, "output")
        if extra.strip():
            prompt = ALPACA_TEMPLATE.format(instruction=instruction, input=extra)
        else:
            prompt = ALPACA_TEMPLATE_NO_INPUT.format(instruction=instruction)
        return [(prompt, False), (output, True)]


class CompletionPrompter:
    """Plain text (`text`, else `content`): every token is a target."""

    name = "completion"
    append_eos = True

    def __init__(self, field: str | None = None):
        self.field = field

    def segments(self, record: dict[str, Any]) -> list[Segment]:
        field = self.field or ("text" if "text" in record else "content")
        return [(_text(record, field), True)]


class ChatTemplateError(InputError):
    """A chat template that cannot be used (syntax, a sandbox violation, an unreadable config); names its origin."""


class TemplateRefused(Exception):
    """`raise_exception(message)` called by a chat template (Hugging Face defines it for templates)."""


def _raise_exception(message: str) -> None:
    raise TemplateRefused(message)


def compile_template(template: str, origin: str) -> Any:
    """The template compiled in Jinja's immutable sandbox, with HF's `raise_exception`; a syntax error names `origin`."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(template)
    except TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template of {origin} has a Jinja syntax error at line {e.lineno} "
                                f"({e.message}); fix the template") from None


def read_tokenizer_config(tokenizer: Tokenizer | None) -> tuple[dict[str, Any], str]:
    """The `tokenizer_config.json` beside the tokenizer's file ({} when none) and its path, for messages."""
    path = as_tokenizer(tokenizer).path if tokenizer is not None else None  # the byte tokenizer has no file, so no config
    config = path.parent / "tokenizer_config.json" if path is not None else None
    if config is None or not config.is_file():
        return {}, "the built-in layout"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ChatTemplateError(f"{config} is not valid JSON ({e}); fix the file or remove it") from None
    if not isinstance(data, dict):
        raise ChatTemplateError(f"{config} holds a {type(data).__name__}, expected a JSON object; fix the file")
    return data, str(config)


def pick_template(template: Any, origin: str, name: str = "default") -> str | None:
    """A config's `chat_template`: a string, or HF's named list [{name, template}, ...] (`name` picked, said so)."""
    if template is None or isinstance(template, str):
        return template
    named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)} if isinstance(template, list) else {}
    if name not in named or not isinstance(named[name], str):
        raise ChatTemplateError(f"{origin}: chat_template has no template named {name!r} (it has: "
                                f"{', '.join(map(str, named)) or 'none'}); name one of them in the entry's chat_template")
    if len(named) > 1:
        log.warning("%s: using the chat template named %r of %s", origin, name, ", ".join(map(str, named)))
    return named[name]


class ChatPrompter:
    """`messages: [{role, content}, ...]`; assistant turns (header included) are targets, the rest is prompt.

    With a Jinja chat template (a tokenizer's `tokenizer_config.json` `chat_template`),
    the conversation is rendered by it and each message's span is found by rendering
    the conversation up to it and up to the one before; without one, the built-in
    `CHAT_TEMPLATE` is used.
    """

    name = "chat"
    append_eos = True

    def __init__(self, chat_template: str | None = None, field: str = "messages", origin: str = "the config"):
        self.chat_template = chat_template
        self.field = field
        self.origin = origin
        self.eos_text = ""
        self._compiled = compile_template(chat_template, origin) if chat_template is not None else None

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer | None) -> ChatPrompter:
        """Use the chat template of the `tokenizer_config.json` beside the tokenizer's file, if any."""
        config, origin = read_tokenizer_config(tokenizer)
        return cls(pick_template(config.get("chat_template"), origin), origin=origin)

    def _messages(self, record: dict[str, Any]) -> list[dict[str, str]]:
        messages = record.get(self.field)
        if not isinstance(messages, list) or not messages:
            raise RecordError(f"record field {self.field!r} must be a non-empty list of {{role, content}} messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
                raise RecordError(
                    f"message {i} of {self.field!r} must be {{role: one of {', '.join(_ROLES)}, content: string}}, got {m!r}"
                )
        return messages

    def _render(self, messages: list[dict[str, str]]) -> str:
        from jinja2 import TemplateError
        from jinja2.sandbox import SecurityError

        try:
            return self._compiled.render(messages=messages, add_generation_prompt=False, bos_token="",
                                         eos_token=self.eos_text)
        except TemplateRefused as e:
            raise RecordError(f"the chat template of {self.origin} refused this conversation: {e}") from None
        except SecurityError as e:  # the template, not the record, is at fault: stop
            raise ChatTemplateError(f"the chat template of {self.origin} did something the sandbox forbids ({e}); "
                                    "fix the template") from None
        except TemplateError as e:
            raise RecordError(f"the chat template of {self.origin} failed on this conversation ({e})") from None

    def spans(self, messages: list[dict[str, str]]) -> list[str]:
        """Each message's rendered text: the conversation up to it, minus the conversation before it."""
        out, before = [], ""
        for i in range(len(messages)):
            upto = self._render(messages[: i + 1])
            if not upto.startswith(before):
                raise RecordError(f"the chat template of {self.origin} does not render a conversation as a prefix "
                                  "of its continuation, so turns cannot be masked")
            out.append(upto[len(before):])
            before = upto
        return out

    def segments(self, record: dict[str, Any]) -> list[Segment]:
        messages = self._messages(record)
        if self.chat_template is None:
            return [(CHAT_TEMPLATE.format(**m), m["role"] == "assistant") for m in messages]
        return [(span, m["role"] == "assistant") for span, m in zip(self.spans(messages), messages)]


# ChatML, as Axolotl's `chat_template: chatml`; its turns end with <|im_end|>, the EOS of train_on_eos
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TRAIN_ON_EOS = ("turn", "all", "last", "none")


class ChatTemplatePrompter(ChatPrompter):
    """Axolotl's `type: chat_template`: a Jinja template renders the turns; trained roles' contents are targets.

    As in Axolotl and HF's assistant masks, only a trained turn's content is a target, not
    its role header; the EOS text that ends a turn (`<|im_end|>` for ChatML, the tokenizer's
    `eos_token` otherwise) is a target by `train_on_eos`: `turn` (after each trained turn),
    `all`, `last` (the conversation's last turn only) or `none`.
    """

    name = "chat_template"
    append_eos = False  # the template ends every turn itself

    def __init__(self, chat_template: str, origin: str, eos_text: str = "", field: str = "messages",
                 role_key: str = "role", content_key: str = "content",
                 roles_to_train: tuple[str, ...] = ("assistant",), train_on_eos: str = "turn"):
        if train_on_eos not in TRAIN_ON_EOS:
            raise ValueError(f"train_on_eos {train_on_eos!r} is not known; use one of: {', '.join(TRAIN_ON_EOS)}")
        super().__init__(chat_template, field, origin)
        self.eos_text, self.role_key, self.content_key = eos_text, role_key, content_key
        self.roles_to_train, self.train_on_eos = tuple(roles_to_train), train_on_eos

    def _messages(self, record: dict[str, Any]) -> list[dict[str, str]]:
        messages = record.get(self.field)
        if not isinstance(messages, list) or not messages:
            raise RecordError(f"record field {self.field!r} must be a non-empty list of messages")
        out = []
        for i, m in enumerate(messages):
            role, content = (m.get(self.role_key), m.get(self.content_key)) if isinstance(m, dict) else (None, None)
            if not isinstance(role, str) or not isinstance(content, str):
                raise RecordError(f"message {i} of {self.field!r} must have string fields {self.role_key!r} and "
                                  f"{self.content_key!r} (message_property_mappings), got {m!r}")
            out.append({"role": role, "content": content})
        return out

    def segments(self, record: dict[str, Any]) -> list[Segment]:
        messages = self._messages(record)
        out: list[Segment] = []
        for i, (span, m) in enumerate(zip(self.spans(messages), messages)):
            trained = m["role"] in self.roles_to_train
            at = span.find(m["content"]) if m["content"] else -1
            if at < 0:  # the template rewrote the content: the whole turn is target or prompt
                out.append((span, trained))
                continue
            rest = span[at + len(m["content"]):]
            eos = self.eos_text if self.eos_text and rest.startswith(self.eos_text) else ""
            out += [(span[:at], False), (m["content"], trained), (eos, self._eos_trained(trained, i, len(messages))),
                    (rest[len(eos):], False)]
        return [seg for seg in out if seg[0]]

    def _eos_trained(self, trained: bool, i: int, n: int) -> bool:
        if self.train_on_eos == "turn":
            return trained
        return self.train_on_eos == "all" or (self.train_on_eos == "last" and i == n - 1)


def eos_text_of(config: dict[str, Any]) -> str:
    """A tokenizer_config.json's `eos_token`: a string, or {"content": ...} (HF's AddedToken)."""
    eos = config.get("eos_token")
    return eos.get("content", "") if isinstance(eos, dict) else eos if isinstance(eos, str) else ""


def chat_template_prompter(entry: Any, tokenizer: Tokenizer | None, default: str | None = None, where: str = "datasets entry") -> ChatTemplatePrompter:
    """The prompter of a `type: chat_template` entry: its (or the top-level) `chat_template` and Axolotl's keys.

    `chat_template`: `tokenizer_default` (the default), `chatml`, an inline Jinja template,
    or the name of one of the tokenizer's named templates.
    """
    choice = entry.chat_template or default or "tokenizer_default"
    config, origin = read_tokenizer_config(tokenizer)
    if choice == "chatml":
        template, origin, eos = CHATML_TEMPLATE, "chatml", "<|im_end|>"
    elif "{{" in choice or "{%" in choice:
        template, origin, eos = choice, f"{where}'s chat_template", eos_text_of(config)
    else:
        name = "default" if choice == "tokenizer_default" else choice
        raw = config.get("chat_template")
        if isinstance(raw, str) and name != "default":
            raise ValueError(f"{where}: chat_template {choice!r} is not known; use tokenizer_default, chatml, "
                             "an inline Jinja template, or a name from the tokenizer's named templates")
        template, eos = pick_template(raw, origin, name), eos_text_of(config)
        if template is None:
            raise ValueError(f"{where}: chat_template is tokenizer_default but {origin} has no chat_template; "
                             "set chat_template: chatml or an inline Jinja template")
    mapping = {"role": entry.message_field_role or "role", "content": entry.message_field_content or "content",
               **(entry.message_property_mappings or {})}
    return ChatTemplatePrompter(template, origin, eos, entry.field_messages, mapping["role"], mapping["content"],
                                tuple(entry.roles_to_train), entry.train_on_eos)


PROMPTERS = {"alpaca": AlpacaPrompter, "chat": ChatPrompter, "chat_template": ChatTemplatePrompter,
             "completion": CompletionPrompter}


def prompter_for(kind: str, tokenizer: Tokenizer | None = None, entry: Any = None, default_template: str | None = None,
                 where: str = "datasets entry") -> Prompter:
    """The prompter for a dataset `type` (`alpaca`, `chat`, `chat_template`, `completion`); an unknown one lists the valid names."""
    if kind not in PROMPTERS:
        raise ValueError(f"dataset type {kind!r} is not known; use one of: {', '.join(PROMPTERS)}")
    if kind == "chat_template":
        if entry is None:
            raise ValueError("type chat_template needs its datasets entry (field_messages, roles_to_train, ...)")
        return chat_template_prompter(entry, tokenizer, default_template, where)
    if kind == "chat":
        return ChatPrompter.for_tokenizer(tokenizer) if tokenizer is not None else ChatPrompter()
    return PROMPTERS[kind]()
