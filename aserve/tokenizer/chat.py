"""Render chat messages into a prompt string (the model's Jinja template or a built-in format).

Templates render in an environment that matches transformers' ``apply_chat_template``
(``transformers/utils/chat_template_utils.py``): an immutable sandbox with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension and a ``{% generation %}`` block, a ``tojson``
filter that keeps non-ASCII and does not escape HTML, and the ``raise_exception``,
``strftime_now``, ``dict`` and ``namespace`` globals; ``messages``, ``tools``, ``documents``,
``add_generation_prompt`` and the special tokens (``bos_token``, ``eos_token``, ...) are passed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from aserve.errors import InvalidRequestError
from aserve.tokenizer.base import Tokenizer

_ROLES = frozenset({"system", "user", "assistant", "tool"})


class _TemplateRejected(TemplateError):
    """What a template's ``raise_exception(...)`` raises."""


def _raise_exception(message: str) -> NoReturn:
    raise _TemplateRejected(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Dict:
    """``dict(...)`` and ``dict.fromkeys(...)`` for templates, without exposing the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's namespace, refusing underscore names (a way towards interpreter internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Namespace's own trick: a field may be named "self"
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attributes ({name!r})")


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks in
    transformers; a prompt only needs its body rendered."""

    tags = {"generation"}  # noqa: RUF012 - jinja's Extension API

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


@cache
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _Namespace
    return env


@cache
def _compile(source: str) -> jinja2.Template:
    return _environment().from_string(source)


def _validate(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check roles and contents; flatten OpenAI-style text parts to a plain string."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list", param="messages")
    out: list[dict[str, Any]] = []
    for k, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise InvalidRequestError(f"messages[{k}] must be an object", param="messages")
        role, content = msg.get("role"), msg.get("content")
        if role not in _ROLES:
            raise InvalidRequestError(
                f"messages[{k}].role is {role!r}; use one of {sorted(_ROLES)}",
                param="messages",
            )
        if isinstance(content, list):
            texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                raise InvalidRequestError(f"messages[{k}].content parts must be text", param="messages")
            content = "".join(t for t in texts if isinstance(t, str))
        if content is None and msg.get("tool_calls"):
            content = ""  # an assistant turn that only calls tools
        if not isinstance(content, str):
            raise InvalidRequestError(f"messages[{k}].content must be a string", param="messages")
        out.append({**msg, "role": role, "content": content})
    return out


def _piece(tokenizer: Tokenizer, token_id: int | None) -> str:
    return tokenizer.id_to_piece(token_id) if token_id is not None else ""


def _reject(message: str) -> NoReturn:
    raise InvalidRequestError(f"chat template rejected the messages: {message}", param="messages")


def apply_chat_template(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    documents: Sequence[dict[str, Any]] | None = None,
    **template_kwargs: Any,
) -> str:
    """Prompt text for ``messages``; encode it with ``add_special_tokens=False`` (BOS is in it).

    ``tools`` (JSON schemas), ``documents`` and any ``template_kwargs`` (``enable_thinking``, ...)
    reach the template as variables, as in transformers; the built-in formats used when the
    model has no template ignore them. A template that fails or calls ``raise_exception``
    raises ``InvalidRequestError``.
    """
    msgs = _validate(messages)
    bos = _piece(tokenizer, tokenizer.bos_token_id)
    eos = _piece(tokenizer, tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None)
    if tokenizer.chat_template is not None:
        try:
            return _compile(tokenizer.chat_template).render(
                **{"bos_token": bos, "eos_token": eos, **template_kwargs},
                messages=msgs,
                tools=list(tools) if tools is not None else None,
                documents=list(documents) if documents is not None else None,
                add_generation_prompt=add_generation_prompt,
            )
        except _TemplateRejected as exc:
            _reject(str(exc))
        except (TemplateError, TypeError, ValueError, LookupError, AttributeError) as exc:
            # The template is the model's code: whatever it raises is a message it cannot render.
            raise InvalidRequestError(f"chat template failed: {exc}", param="messages") from exc
    if tokenizer.piece_to_id("<start_of_turn>") is not None:
        return _gemma(msgs, bos, add_generation_prompt)
    if tokenizer.piece_to_id("<|start_header_id|>") is not None:
        return _llama3(msgs, bos, add_generation_prompt)
    return _llama2(msgs, bos, eos)


def _gemma(msgs: list[dict[str, Any]], bos: str, add_generation_prompt: bool) -> str:
    # Gemma has no system role: its template prepends the system text to the first user turn.
    prefix = ""
    if msgs[0]["role"] == "system":
        prefix = msgs[0]["content"] + "\n\n"
        msgs = msgs[1:]
    parts = [bos]
    for k, msg in enumerate(msgs):
        role = "model" if msg["role"] == "assistant" else msg["role"]
        if role not in ("user", "model") or (role == "user") != (k % 2 == 0):
            _reject("Conversation roles must alternate user/assistant/user/assistant/...")
        text = (prefix if k == 0 else "") + msg["content"].strip()
        parts.append(f"<start_of_turn>{role}\n{text}<end_of_turn>\n")
    if add_generation_prompt:
        parts.append("<start_of_turn>model\n")
    return "".join(parts)


def _llama3(msgs: list[dict[str, Any]], bos: str, add_generation_prompt: bool) -> str:
    parts = [bos]
    for msg in msgs:
        role = "ipython" if msg["role"] == "tool" else msg["role"]
        parts.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{msg['content'].strip()}<|eot_id|>")
    if add_generation_prompt:
        parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def _llama2(msgs: list[dict[str, Any]], bos: str, eos: str) -> str:
    # Llama 2 ends each prompt with [/INST]; the generation prompt is implicit.
    system = ""
    if msgs[0]["role"] == "system":
        system = f"<<SYS>>\n{msgs[0]['content']}\n<</SYS>>\n\n"
        msgs = msgs[1:]
    parts: list[str] = []
    for k, msg in enumerate(msgs):
        if (msg["role"] == "user") != (k % 2 == 0) or msg["role"] not in (
            "user",
            "assistant",
        ):
            _reject("Conversation roles must alternate user/assistant/user/assistant/...")
        if msg["role"] == "user":
            text = (system if k == 0 else "") + msg["content"].strip()
            parts.append(f"{bos}[INST] {text} [/INST]")
        else:
            parts.append(f" {msg['content'].strip()} {eos}")
    return "".join(parts)
