"""Find a model's tokenizer and chat template and build the right backend for them.

* GGUF ``llama`` vocabulary -> sentencepiece; GGUF ``gpt2`` vocabulary -> ``tokenizers``
  (converted once, then cached as ``tokenizer.json`` under the cache directory).
* Hugging Face directory: ``tokenizer.model`` -> sentencepiece (as before), else
  ``tokenizer.json`` -> ``tokenizers``.
* Chat template: GGUF ``tokenizer.chat_template``; in a directory ``chat_template.jinja``,
  then ``tokenizer_config.json``'s ``chat_template``, then ``chat_template.json``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as HFTokenizer

from aserve.errors import ModelLoadError, ModelNotFoundError
from aserve.tokenizer.base import ChatTemplate, Tokenizer
from aserve.tokenizer.fast import FastTokenizer
from aserve.tokenizer.gguf_bpe import bpe_from_gguf
from aserve.tokenizer.gguf_proto import proto_from_gguf, read_gguf_metadata, sp_pb2
from aserve.tokenizer.spm import SentencePieceTokenizer

_CACHE_VERSION = "1"
_GGUF_TEMPLATE = "GGUF metadata (tokenizer.chat_template)"


def load_tokenizer(path: str | Path, cache_dir: Path | None = None) -> Tokenizer:
    """The tokenizer of a model path: a ``.gguf`` file or a Hugging Face directory.

    ``cache_dir`` keeps GGUF byte-level vocabularies converted to ``tokenizer.json`` form.
    """
    path = Path(path)
    if path.suffix == ".gguf":
        return tokenizer_from_gguf(path, cache_dir)
    return tokenizer_from_hf_dir(path)


# ---- GGUF ---------------------------------------------------------------------------------


def tokenizer_from_gguf(path: str | Path, cache_dir: Path | None = None) -> Tokenizer:
    """From a GGUF file's ``tokenizer.*`` metadata: sentencepiece (``llama``) or byte-level BPE (``gpt2``)."""
    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"GGUF file {path} does not exist")
    cached = _gguf_cache_path(path, cache_dir) if cache_dir is not None else None
    if cached is not None and (cached / "tokenizer.json").is_file():
        try:
            return _load_cached(path, cached)
        except Exception:  # a stale or partial cache is rebuilt below
            shutil.rmtree(cached, ignore_errors=True)
    meta = read_gguf_metadata(path)
    raw = meta.get("tokenizer.chat_template")
    template = ChatTemplate(raw, _GGUF_TEMPLATE) if isinstance(raw, str) and raw else None
    model = meta.get("tokenizer.ggml.model")
    if model == "llama":
        proto, special = proto_from_gguf(meta)
        return SentencePieceTokenizer(
            proto,
            bos_token_id=special.bos,
            eos_token_ids=[special.eos] if special.eos is not None else [],
            add_bos=special.add_bos,
            chat_template=template,
            source=f"sentencepiece: {path.name} (GGUF llama vocabulary)",
        )
    if model == "gpt2":
        vocab = bpe_from_gguf(meta)
        facts = {
            "bos_token_id": vocab.bos_token_id,
            "eos_token_ids": list(vocab.eos_token_ids),
            "pre": vocab.pre,
            "chat_template": template.text if template is not None else None,
        }
        where = "not cached"
        if cached is not None and _write_cache(cached, vocab.backend, facts):
            where = f"cached in {cached}"
        return FastTokenizer(
            vocab.backend,
            bos_token_id=vocab.bos_token_id,
            eos_token_ids=vocab.eos_token_ids,
            chat_template=template,
            source=f"tokenizers: {path.name} (GGUF gpt2 vocabulary, pre-tokenizer {vocab.pre}; {where})",
        )
    raise ModelLoadError(f"tokenizer.ggml.model={model!r} in {path} is unsupported; supported: llama, gpt2")


def _gguf_cache_path(gguf: Path, cache_dir: Path) -> Path:
    st = gguf.stat()
    return cache_dir / f"{gguf.stem}-{st.st_size}-{st.st_mtime_ns}-tokenizer-v{_CACHE_VERSION}"


def _write_cache(cached: Path, backend: HFTokenizer, facts: dict[str, Any]) -> bool:
    """Write ``tokenizer.json`` + ``aserve_tokenizer.json`` atomically; False if it cannot."""
    tmp = cached.with_name(f"{cached.name}.tmp{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        backend.save(str(tmp / "tokenizer.json"))
        (tmp / "aserve_tokenizer.json").write_text(json.dumps(facts), encoding="utf-8")
        tmp.replace(cached)  # a concurrent loader sees all of it or none of it
        return True
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return cached.is_dir()  # another process may have won the race


def _load_cached(gguf: Path, cached: Path) -> Tokenizer:
    facts = json.loads((cached / "aserve_tokenizer.json").read_text(encoding="utf-8"))
    raw = facts.get("chat_template")
    return FastTokenizer(
        HFTokenizer.from_file(str(cached / "tokenizer.json")),
        bos_token_id=facts["bos_token_id"],
        eos_token_ids=facts["eos_token_ids"],
        chat_template=ChatTemplate(raw, _GGUF_TEMPLATE) if isinstance(raw, str) else None,
        source=f"tokenizers: {gguf.name} (GGUF gpt2 vocabulary, pre-tokenizer {facts['pre']}; cached in {cached})",
    )


# ---- Hugging Face directory ---------------------------------------------------------------


def tokenizer_from_hf_dir(root: str | Path) -> Tokenizer:
    """From a Hugging Face directory: ``tokenizer.model`` if present (sentencepiece), else ``tokenizer.json``."""
    root = Path(root)
    tok_cfg = _read_json(root / "tokenizer_config.json")
    template = find_chat_template(root, tok_cfg)
    if (root / "tokenizer.model").is_file():
        return _sentencepiece_dir(root, tok_cfg, template)
    if (root / "tokenizer.json").is_file():
        return _tokenizers_dir(root, tok_cfg, template)
    raise ModelNotFoundError(f"{root} has neither tokenizer.model (sentencepiece) nor tokenizer.json")


def find_chat_template(root: Path, tok_cfg: dict[str, Any]) -> ChatTemplate | None:
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        return ChatTemplate(jinja.read_text(encoding="utf-8"), "chat_template.jinja")
    for name, cfg in (
        ("tokenizer_config.json", tok_cfg),
        ("chat_template.json", _read_json(root / "chat_template.json")),
    ):
        text = cfg.get("chat_template")
        if isinstance(text, list):  # several named templates: use the default one
            text = next((t.get("template") for t in text if isinstance(t, dict) and t.get("name") == "default"), None)
        if isinstance(text, str) and text:
            return ChatTemplate(text, name)
    return None


def _sentencepiece_dir(root: Path, tok_cfg: dict[str, Any], template: ChatTemplate | None) -> Tokenizer:
    model_file = root / "tokenizer.model"
    try:
        proto = sp_pb2.ModelProto.FromString(model_file.read_bytes())
    except Exception as exc:  # protobuf raises its own DecodeError type
        raise ModelLoadError(f"{model_file} is not a sentencepiece model: {exc}") from exc
    pieces = {p.piece: i for i, p in enumerate(proto.pieces)}
    spec = proto.trainer_spec
    bos, eos = _bos_eos(
        root, tok_cfg, pieces.get, spec.bos_id if spec.bos_id >= 0 else None, [spec.eos_id] if spec.eos_id >= 0 else []
    )
    return SentencePieceTokenizer(
        proto,
        bos_token_id=bos,
        eos_token_ids=eos,
        add_bos=bool(tok_cfg.get("add_bos_token", True)),
        chat_template=template,
        source="sentencepiece: tokenizer.model",
    )


def _tokenizers_dir(root: Path, tok_cfg: dict[str, Any], template: ChatTemplate | None) -> Tokenizer:
    path = root / "tokenizer.json"
    try:
        backend = HFTokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception on a bad file
        raise ModelLoadError(f"cannot load {path}: {exc}") from exc
    # Like transformers: the tokens tokenizer_config.json names (bos_token, ...) are special
    # added tokens even when tokenizer.json does not list them as such.
    added = {t.content for t in backend.get_added_tokens_decoder().values()}
    named = [_content(tok_cfg.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")]
    extra = tok_cfg.get("additional_special_tokens") or tok_cfg.get("extra_special_tokens") or []
    named += [_content(v) for v in (extra if isinstance(extra, list) else [])]
    missing = [t for t in dict.fromkeys(named) if t is not None and t not in added]
    if missing:
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])
    bos_text, eos_text = _content(tok_cfg.get("bos_token")), _content(tok_cfg.get("eos_token"))
    # transformers keeps tokenizer.json's post-processor unless tokenizer_config.json sets
    # add_bos_token/add_eos_token (or there is none): then BOS/EOS follow those flags.
    if "add_bos_token" in tok_cfg or "add_eos_token" in tok_cfg or backend.post_processor is None:
        marks: list[tuple[str, int]] = []
        head: list[str] = []
        tail: list[str] = []
        for text, flag, side in ((bos_text, "add_bos_token", head), (eos_text, "add_eos_token", tail)):
            tid = backend.token_to_id(text) if text is not None else None
            if tok_cfg.get(flag) and text is not None and tid is not None:
                side.append(text)
                marks.append((text, tid))
        backend.post_processor = processors.TemplateProcessing(
            single=[*head, "$A", *tail], pair=[*head, "$A", *tail, *head, "$B:1", *tail], special_tokens=marks
        )
    bos, eos = _bos_eos(root, tok_cfg, backend.token_to_id, None, [])
    return FastTokenizer(
        backend, bos_token_id=bos, eos_token_ids=eos, chat_template=template, source="tokenizers: tokenizer.json"
    )


def _bos_eos(
    root: Path,
    tok_cfg: dict[str, Any],
    lookup: Callable[[str], int | None],
    bos: int | None,
    eos: list[int],
) -> tuple[int | None, list[int]]:
    """BOS and the EOS ids from the model's config files, later files winning; generation
    stops on what generation_config.json lists, and on tokenizer_config.json's eos_token."""
    for cfg in (_read_json(root / "config.json"), tok_cfg, _read_json(root / "generation_config.json")):
        bos_ids = _token_ids(cfg.get("bos_token_id"), lookup)
        bos = bos_ids[0] if bos_ids else bos
        if cfg.get("eos_token_id") is not None:
            eos = _token_ids(cfg["eos_token_id"], lookup)
    bos_ids = _token_ids(tok_cfg.get("bos_token"), lookup)
    if bos_ids:
        bos = bos_ids[0]
    eos_ids = _token_ids(tok_cfg.get("eos_token"), lookup)
    if eos_ids and eos_ids[0] not in eos:
        eos.insert(0, eos_ids[0])
    return bos, eos


def _content(value: Any) -> str | None:
    """A token's text from a config value: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot parse {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _token_ids(value: Any, lookup: Callable[[str], int | None]) -> list[int]:
    """Ids from a config value: an int, a list of ints, a token string or an AddedToken dict."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [i for v in value for i in _token_ids(v, lookup)]
    if isinstance(value, dict):
        return _token_ids(value.get("content"), lookup)
    if isinstance(value, str):
        i = lookup(value)
        return [] if i is None else [i]
    return []
