"""Render chat messages into a prompt string (Jinja template or a built-in format)."""

from __future__ import annotations

from typing import Any, NoReturn

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from aserve.errors import InvalidRequestError
from aserve.tokenizer.tokenizer import Tokenizer

_ROLES = frozenset({"system", "user", "assistant", "tool"})


def _raise_exception(message: str) -> NoReturn:
    raise InvalidRequestError(f"chat template rejected the messages: {message}", param="messages")


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
        if not isinstance(content, str):
            raise InvalidRequestError(f"messages[{k}].content must be a string", param="messages")
        out.append({**msg, "role": role, "content": content})
    return out


def _piece(tokenizer: Tokenizer, token_id: int | None) -> str:
    return tokenizer.id_to_piece(token_id) if token_id is not None else ""


def apply_chat_template(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
) -> str:
    """Prompt text for ``messages``; encode it with ``add_special_tokens=False`` (BOS is in it)."""
    msgs = _validate(messages)
    bos = _piece(tokenizer, tokenizer.bos_token_id)
    eos = _piece(tokenizer, tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None)
    if tokenizer.chat_template is not None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        try:
            template = env.from_string(tokenizer.chat_template)
            return template.render(
                messages=msgs,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos,
                eos_token=eos,
            )
        except TemplateError as exc:
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
            _raise_exception("Conversation roles must alternate user/assistant/user/assistant/...")
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
            _raise_exception("Conversation roles must alternate user/assistant/user/assistant/...")
        if msg["role"] == "user":
            text = (system if k == 0 else "") + msg["content"].strip()
            parts.append(f"{bos}[INST] {text} [/INST]")
        else:
            parts.append(f" {msg['content'].strip()} {eos}")
    return "".join(parts)
