"""HTTP endpoints: completions, chat completions, models, health, metrics, OpenAPI."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import anyio
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from aserve import __version__
from aserve.engine import Engine
from aserve.errors import ContextLengthError, InvalidRequestError
from aserve.ipc.client import EngineClient
from aserve.sampling_params import SamplingParams
from aserve.server.errors import RETRY_AFTER_S, APIError
from aserve.server.limits import BodyLimits
from aserve.server.openapi import openapi_document
from aserve.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    messages_as_dicts,
)
from aserve.server.render import (
    ChatChunks,
    CompletionChunks,
    Echo,
    PromptIds,
    chat_response,
    completion_response,
)
from aserve.server.responses import (
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeResponse,
)
from aserve.server.sse import SSEResponse, stream_events
from aserve.server.state import ServerState
from aserve.server.tools import ToolUse, messages_for, tool_use
from aserve.tokenizer.chat import apply_chat_template
from aserve.tokenizer.tokenizer import Tokenizer

T = TypeVar("T")


def _server(request: Request) -> ServerState:
    return cast(ServerState, request.state.server)


async def read_body(request: Request, limits: BodyLimits) -> bytes:
    """The whole body, or 413 past ``limits.max_bytes`` and 408 past ``limits.timeout_s``
    (also the Ray ingress's, which must read a body before it can route it)."""
    limit = limits.max_bytes
    declared = request.headers.get("content-length", "")
    # Answered with the body unread, the connection is not reused: the client is told so.
    close = {"Connection": "close"}
    if declared.isdigit() and int(declared) > limit:
        raise APIError(
            413, f"request body is {declared} bytes; the limit is {limit}", "invalid_request_error", headers=close
        )
    body = bytearray()
    with anyio.move_on_after(limits.timeout_s) as arrival:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:  # a chunked body has no Content-Length to check up front
                raise APIError(
                    413, f"request body exceeds the limit of {limit} bytes", "invalid_request_error", headers=close
                )
    if arrival.cancelled_caught:
        # The body was not read to its end, so the connection cannot be reused: Hypercorn closes it.
        raise APIError(
            408,
            f"the request body did not arrive within {limits.timeout_s:g} s",
            "invalid_request_error",
            headers=close,
        )
    return bytes(body)


async def _read_json(request: Request, limits: BodyLimits) -> Any:
    body = await read_body(request, limits)
    try:
        value = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise APIError(400, f"request body is not valid UTF-8: {exc}", "invalid_request_error") from exc
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, or an int of over 4300 digits
        raise APIError(400, f"request body is not valid JSON: {exc}", "invalid_request_error") from exc
    # JSON may escape half of a UTF-16 pair ("\ud800"): such a str cannot be encoded, so it
    # would fail later, in the tokenizer or the response. Only a body with such an escape is walked.
    if _SURROGATE_ESCAPE.search(body):
        where = _lone_surrogate(value)
        if where is not None:
            raise APIError(
                400,
                f"{where or 'request body'}: contains a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape)",
                "invalid_request_error",
                param=where or None,
            )
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: Any) -> str | None:
    """The dotted path (as pydantic names fields) of a str holding a lone surrogate, or
    None. A bad key names its object: the path goes back to the client, so it must encode."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:  # a stack, not recursion: nesting depth is the client's choice
        path, item = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                return path
        elif isinstance(item, dict):
            for key, sub in item.items():
                if _has_surrogate(key):
                    return path
                stack.append((f"{path}.{key}" if path else key, sub))
        elif isinstance(item, list):
            stack.extend((f"{path}.{i}" if path else str(i), sub) for i, sub in enumerate(item))
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_model(server: ServerState, name: str) -> None:
    if name not in server.model_names():
        raise APIError(
            404,
            f"the model `{name}` does not exist; this server serves `{server.settings.served_model_name}`",
            "not_found_error",
            param="model",
        )


def _check_length(engine: Engine | EngineClient, prompt_len: int, requested: int | None, field: str) -> None:
    # An explicit limit (``field``) that cannot fit is a client error (as with OpenAI), not a silent cap.
    ctx = engine.max_context
    if requested is not None and prompt_len < ctx and prompt_len + requested > ctx:
        raise ContextLengthError(
            f"this model's maximum context length is {ctx} tokens; the prompt has {prompt_len} tokens and "
            f"{field} asks for {requested} more; lower {field} to at most {ctx - prompt_len}",
            param=field,
        )


# One request's prompts times n: each is a request in the engine, so bound the fan-out.
MAX_CHOICES = 128


@dataclass(frozen=True)
class _Prompt:
    ids: list[int]
    text: str | None  # what `echo` repeats: the prompt as sent; None: decode the ids (once admitted)


def _completion_prompts(tok: Tokenizer, prompt: str | list[Any]) -> list[_Prompt]:
    """OpenAI's ``prompt``: a string, token ids, or a non-empty list of either."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        items: list[str | list[int]] = prompt
    elif isinstance(prompt, list) and not prompt:
        raise InvalidRequestError("prompt is empty", param="prompt")
    else:
        items = [prompt]
    out = []
    for k, item in enumerate(items):
        where = "prompt" if len(items) == 1 else f"prompt.{k}"
        if isinstance(item, str):
            if not item:
                raise InvalidRequestError(f"{where} is empty", param=where)
            # What the engine does for a str prompt: BOS is added.
            out.append(_Prompt(tok.encode(item, add_special_tokens=True), item))
        else:
            if not item:
                raise InvalidRequestError(f"{where} is empty", param=where)
            out.append(_Prompt(list(item), None))  # admission checks the ids against the vocabulary
    return out


def _echo(tok: Tokenizer, prompts: list[_Prompt], n: int) -> Echo:
    texts = [p.text if p.text is not None else tok.decode(p.ids, skip_special_tokens=False) for p in prompts]
    return Echo(ids=[p.ids for p in prompts], n=n, texts=texts, decoded=[p.text is None for p in prompts])


async def _generate(
    request: Request,
    endpoint: str,
    req: CompletionRequest | ChatCompletionRequest,
    prompts_of: Callable[[Tokenizer], list[_Prompt]],
) -> Response:
    server = _server(request)
    _check_model(server, req.model)
    engine = server.admit()
    handed_off = False
    timer = server.metrics.timer(endpoint)
    try:
        tok = engine.tokenizer
        params: SamplingParams = req.sampling_params()
        tools = req.tool_use() if isinstance(req, ChatCompletionRequest) else None
        prompts = prompts_of(tok)
        if len(prompts) * params.n > MAX_CHOICES:
            raise InvalidRequestError(
                f"{len(prompts)} prompts times n={params.n} is {len(prompts) * params.n} choices; "
                f"the limit is {MAX_CHOICES} per request",
                param="prompt",
            )
        requested, field = req.max_tokens, "max_tokens"
        if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
            requested, field = req.max_completion_tokens, "max_completion_tokens"
        for p in prompts:
            _check_length(engine, len(p.ids), requested, field)
        prompt_tokens = sum(len(p.ids) for p in prompts)
        echoes = isinstance(req, CompletionRequest) and bool(req.echo)
        prefix = "chatcmpl-" if endpoint == "chat" else "cmpl-"
        rid = prefix + request.state.request_id
        want_lps = params.logprobs is not None
        ids = [p.ids for p in prompts]
        ids_back = PromptIds(ids, params.n) if req.return_token_ids else None
        if req.stream:
            # Validates and submits synchronously: admission errors (context, queue full)
            # still get a real status, and the response starts at once.
            gen = engine.open_streams(ids, params, request_id=rid)
            await gen.admitted()  # an engine core in another process answers over IPC
            timer.admitted(prompt_tokens)
            echo = _echo(tok, prompts, params.n) if echoes else None
            maker = (
                ChatChunks(tok, rid, req.model, params.n, want_lps, tools, ids_back)
                if endpoint == "chat"
                else CompletionChunks(tok, rid, req.model, want_lps, echo, ids_back)
            )
            body = stream_events(
                gen, maker, prompt_tokens=prompt_tokens, include_usage=req.include_usage, timer=timer,
                cached_tokens=lambda: gen.cached_tokens, keepalive_s=server.settings.body.sse_keepalive_s,
            )  # fmt: skip
            handed_off = True
            return SSEResponse(body, gen, server.release)
        results = await _while_connected(
            request, lambda: engine.complete_many(ids, params, request_id=rid), f"complete[{rid}]"
        )
        if not results:
            timer.finish("abort")
            return Response(status_code=499)  # nobody is left to read it; keeps the access log honest
        result = results[0]
        timer.admitted(prompt_tokens)
        if any(o.finish_reason == "abort" for o in result.outputs):
            raise APIError(503, "the server is shutting down; request aborted", "request_aborted")
        timer.observe_result(result.metrics, result.usage.completion_tokens)
        timer.finish("success")
        if endpoint == "chat":
            doc: BaseModel = chat_response(tok, rid, req.model, result, want_lps, tools, ids_back)
        else:
            echo = _echo(tok, prompts, params.n) if echoes else None
            doc = completion_response(tok, rid, req.model, result, want_lps, echo, ids_back)
        return JSONResponse(doc.model_dump(mode="json"))
    finally:
        if not handed_off:
            # Rejections and failures are counted by status in the middleware.
            server.release()


async def _while_connected(request: Request, work: Callable[[], Awaitable[T]], name: str) -> list[T]:
    """``[await work()]``, or ``[]`` if the client disconnects first (``work`` is then cancelled,
    which aborts its engine request and frees the KV)."""
    found: list[T] = []

    async def run() -> None:
        found.append(await work())
        tg.cancel_scope.cancel()

    async def watch_disconnect() -> None:
        # The body has been read, so the next message can only be the disconnect.
        while (await request.receive())["type"] != "http.disconnect":
            pass
        tg.cancel_scope.cancel()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, name=f"aserve.server.{name}")
            tg.start_soon(watch_disconnect, name=f"aserve.server.watch_disconnect[{name}]")
    except BaseExceptionGroup as group:
        # Unwrap so that an AserveError from the engine still maps to its own status.
        if len(group.exceptions) == 1 and isinstance(group.exceptions[0], Exception):
            raise group.exceptions[0] from None
        raise
    return found


async def completions(request: Request) -> Response:
    req = CompletionRequest.parse(await _read_json(request, _server(request).settings.body))
    return await _generate(request, "completions", req, lambda tok: _completion_prompts(tok, req.prompt))


async def chat_completions(request: Request) -> Response:
    req = ChatCompletionRequest.parse(await _read_json(request, _server(request).settings.body))

    def prompts_of(tok: Tokenizer) -> list[_Prompt]:
        text = _chat_text(tok, req.message_dicts(), req.tool_use())
        # The template already starts with BOS; encoding must not add a second one.
        return [_Prompt(tok.encode(text, add_special_tokens=False), text)]

    return await _generate(request, "chat", req, prompts_of)


def _chat_text(
    tok: Tokenizer, messages: list[dict[str, Any]], use: ToolUse | None, add_generation_prompt: bool = True
) -> str:
    """A conversation as the model's chat template lays it out, with the tools it may call:
    given to a template that takes tools, else as aserve's instruction (``messages_for``)."""
    takes_tools = tok.chat_template is not None and "tools" in tok.chat_template
    laid_out = messages_for(messages, use, takes_tools)
    tools = use.tool_dicts() if use is not None and takes_tools else None
    return apply_chat_template(tok, laid_out, add_generation_prompt, tools=tools)


def _ready_engine(server: ServerState) -> Engine | EngineClient:
    if not server.ready or server.engine is None:
        raise APIError(503, "the engine is not ready", "engine_closed", headers={"Retry-After": RETRY_AFTER_S})
    return server.engine


async def tokenize(request: Request) -> Response:
    """vLLM's ``/tokenize``: a text (``prompt``) or chat ``messages`` to token ids."""
    server = _server(request)
    body = await _read_json(request, server.settings.body)
    form = TokenizeChatRequest if isinstance(body, dict) and "messages" in body else TokenizeCompletionRequest
    req = form.parse(body)
    if req.model is not None:
        _check_model(server, req.model)
    engine = _ready_engine(server)
    tok = engine.tokenizer
    if isinstance(req, TokenizeChatRequest):
        # Laid out as /v1/chat/completions lays it out: tool turns and the tools offered included.
        use = tool_use(req.tools, None, None)
        text = _chat_text(tok, messages_as_dicts(req.messages), use, req.add_generation_prompt)
    else:
        text = req.prompt
    ids = tok.encode(text, add_special_tokens=req.add_special_tokens)
    strs = [tok.id_to_piece(t) for t in ids] if req.return_token_strs else None
    doc = TokenizeResponse(count=len(ids), max_model_len=engine.max_context, tokens=ids, token_strs=strs)
    return JSONResponse(doc.model_dump(mode="json"))


async def detokenize(request: Request) -> Response:
    """vLLM's ``/detokenize``: token ids to text (special tokens kept, as vLLM does)."""
    server = _server(request)
    req = DetokenizeRequest.parse(await _read_json(request, server.settings.body))
    if req.model is not None:
        _check_model(server, req.model)
    tok = _ready_engine(server).tokenizer
    bad = [t for t in req.tokens if t >= tok.vocab_size]
    if bad:
        raise InvalidRequestError(f"token ids must be in [0, {tok.vocab_size}); got {bad[:5]}", param="tokens")
    return JSONResponse(DetokenizeResponse(prompt=tok.decode(req.tokens, skip_special_tokens=False)).model_dump())


def _model_card(server: ServerState) -> ModelCard:
    ctx = server.engine.max_context if server.ready and server.engine is not None else None
    return ModelCard(id=server.settings.served_model_name, max_model_len=ctx)


async def models(request: Request) -> Response:
    listing = ModelList(data=[_model_card(_server(request))])
    return JSONResponse(listing.model_dump(mode="json"))


async def model(request: Request) -> Response:
    """OpenAI's ``GET /v1/models/{model}`` (the client's ``models.retrieve``): the served
    model's card, or 404 for any other name."""
    server = _server(request)
    _check_model(server, request.path_params["model"])
    return JSONResponse(_model_card(server).model_dump(mode="json"))


async def health(request: Request) -> Response:
    server = _server(request)
    if server.engine_failed is not None:
        failed = server.engine_failed
        return JSONResponse({"status": "failed", "type": failed.error_type, "error": str(failed)}, 503)
    if server.draining:
        return JSONResponse({"status": "draining"}, 503)
    if not server.ready:
        return JSONResponse({"status": "loading"}, 503, headers={"Retry-After": "1"})
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    server = _server(request)
    refresh = getattr(server.engine, "refresh_stats", None)  # an engine core in another process
    if refresh is not None:
        await refresh()
    return Response(server.metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def flush_cache(request: Request) -> Response:
    """Drop the prefix cache; 409 while requests are running or waiting."""
    server = _server(request)
    if not server.ready or server.engine is None:
        raise APIError(503, "the engine is not ready", "engine_closed")
    freed = server.engine.flush_cache()
    if inspect.isawaitable(freed):  # the engine core of another process answers over IPC
        freed = await freed
    if freed < 0:
        raise APIError(409, "requests are running; flush the cache when the server is idle", "conflict")
    return JSONResponse({"flushed_tokens": freed})


async def openapi(request: Request) -> Response:
    server = _server(request)
    doc = openapi_document("aserve", __version__, bearer_auth=server.settings.api_key is not None)
    return JSONResponse(doc)


def routes() -> list[Route]:
    return [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/admin/flush_cache", flush_cache, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
    ]
