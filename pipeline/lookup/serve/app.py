"""The HTTP API (FastAPI) over a ``ServedStore``; docs/serving.md describes each route.

Every answer is JSON; every refusal is a 4xx with ``{"error": "<one line>"}``: bad input
is the client's to fix, so no traceback ever leaves the server.
"""

from __future__ import annotations

import hmac
import os
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from elmo_model.errors import ElmoUserError
from pipeline.lookup.doc_fields import as_filters, parse_where
from pipeline.lookup.pooled.routes import add_passage_routes
from pipeline.lookup.senses.clusters import cluster_senses
from pipeline.lookup.senses.hits import Hit
from pipeline.lookup.senses.search import locate_word
from pipeline.lookup.serve.batching import Batcher
from pipeline.lookup.serve.limits import (
    MAX_BODY_BYTES,
    MAX_CLUSTERS,
    MAX_CONTEXT,
    MAX_EMBED_TOKENS,
    MAX_FILTERS,
    MAX_K,
    MAX_OCCURRENCE,
    MAX_PAGE,
    MAX_SENTENCE_CHARS,
    MAX_SENTENCES,
    MAX_SQL_CHARS,
    MAX_WORD_CHARS,
)
from pipeline.lookup.serve.resources import ServedStore
from pipeline.lookup.serve.sql_worker import json_ready as _plain

STATIC = Path(__file__).parent / "static"
Scalar = str | int | float | bool


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EmbedRequest(Strict):
    sentences: list[Annotated[str, Field(min_length=1, max_length=MAX_SENTENCE_CHARS)]] = \
        Field(min_length=1, max_length=MAX_SENTENCES)
    mix: str | None = Field(None, description="a mix name (top, average, layer:<k>, a "
                            "stored mix); null for every layer", max_length=200)


class SearchRequest(Strict):
    sentence: str = Field(min_length=1, max_length=MAX_SENTENCE_CHARS)
    word: str = Field(min_length=1, max_length=MAX_WORD_CHARS)
    occurrence: int = Field(1, ge=1, le=MAX_OCCURRENCE)
    k: int = Field(10, ge=1, le=MAX_K)
    any_word: bool = False
    filters: dict[str, Scalar | Annotated[list[Scalar], Field(max_length=20)]
                  | dict[Literal["=", "!=", ">=", "<=", ">", "<", "~"], Scalar]] | None = \
        Field(None, max_length=MAX_FILTERS,
              description="document fields: {field: value} (equal), {field: [a, b, ...]} "
                          "(any of these), {field: {\">=\": low, \"<=\": high}} (compare; "
                          "both: a range, ends included)")
    where: list[Annotated[str, Field(min_length=1, max_length=500)]] = Field(
        default_factory=list, max_length=MAX_FILTERS,
        description="conditions as `elmo senses search --where` writes them: 'year>=1900', "
                    "'year=1900..1950', 'party=A|B', 'source~moby_dick' (contains, any case)")
    index: str | None = Field(None, max_length=200)


class SqlRequest(Strict):
    query: str = Field(min_length=1, max_length=MAX_SQL_CHARS)
    params: dict[str, Scalar | None] | None = Field(None, max_length=100)


def hit_json(hit: Hit, store: ServedStore) -> dict[str, Any]:
    return {"rank": hit.rank, "similarity": round(hit.similarity, 6), "token": hit.token,
            "doc_id": hit.doc_id, "sent_idx": hit.sent_idx, "tok_idx": hit.tok_idx,
            "sentence": hit.sentence, "start": hit.start, "end": hit.end,
            "document": store.documents.get(hit.doc_id, {})}


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split())}, status_code=status)


def create_app(store: ServedStore, token: str | None = None) -> FastAPI:
    batcher = Batcher(store.embedder, store.ds.descriptor)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        await batcher.stop()
        store.sql.close()

    app = FastAPI(title="elmo-store", lifespan=lifespan,
                  description="ELMo embeddings, sense search and SQL over one dataset.")
    app.state.store, app.state.batcher = store, batcher
    _add_error_handlers(app)
    _add_page_routes(app, store, batcher)
    _add_sense_routes(app, store, batcher)
    _add_data_routes(app, store)
    add_passage_routes(app, store, batcher)
    app.add_middleware(GuardMiddleware, token=token, max_body=MAX_BODY_BYTES,
                       batcher=batcher)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = first.get("msg", "invalid request")
        return error(422, f"{where}: {message}" if where else message)

    @app.exception_handler(ElmoUserError)
    async def user_error(_: Request, exc: ElmoUserError) -> JSONResponse:
        return error(400, str(exc))

    @app.exception_handler(LookupError)
    async def not_found(_: Request, exc: LookupError) -> JSONResponse:
        return error(404, str(exc.args[0]) if exc.args else "not found")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        traceback.print_exception(exc, file=sys.stderr)  # for the operator, not the client
        return error(500, f"internal error ({type(exc).__name__}); see the server log")


def _add_page_routes(app: FastAPI, store: ServedStore, batcher: Batcher) -> None:
    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/static/plotly.min.js", include_in_schema=False)
    async def plotly_js() -> FileResponse:
        import plotly

        # The copy inside the installed plotly package: the page works offline.
        return FileResponse(Path(plotly.__file__).parent / "package_data" / "plotly.min.js",
                            media_type="text/javascript")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/info", summary="the dataset and the indexes served")
    async def info() -> dict[str, Any]:
        described = await run_in_threadpool(store.info)
        stats = batcher.stats
        described["batching"] = {"batches": stats.batches, "jobs": stats.jobs,
                                 "largest": stats.largest}
        described["process"] = os.getpid()  # which server (or Ray Serve replica) answered
        return described


def _add_sense_routes(app: FastAPI, store: ServedStore, batcher: Batcher) -> None:
    @app.post("/embed", summary="tokens and vectors of sentences")
    async def embed(body: EmbedRequest) -> JSONResponse:
        if body.mix is not None:
            store.ds.mix(body.mix)  # an unknown mix is refused before the model runs
        tokens = [store.tokens(s) for s in body.sentences]
        if sum(map(len, tokens)) > MAX_EMBED_TOKENS:
            raise ElmoUserError(f"{sum(map(len, tokens)):,} tokens in one request; at most "
                                f"{MAX_EMBED_TOKENS:,} per /embed: send fewer sentences at once")
        layers = await batcher.embed(tokens)
        vectors = store.mixed(layers, body.mix)
        return JSONResponse({"mix": body.mix, "sentences": [
            {"tokens": t, "vectors": v.round(6).tolist()}
            for t, v in zip(tokens, vectors, strict=True)]})

    @app.post("/senses/search", summary="uses of a word nearest in meaning to a sentence's")
    async def senses_search(body: SearchRequest) -> JSONResponse:
        name, ix = store.index(body.index)
        query = locate_word(body.sentence, body.word, body.occurrence,
                            tokenizer=store.tokenizer)
        # Document-field filters become the index's prefilter, as for `elmo senses search
        # --where`: on the index's own field columns, else a join on the documents table.
        conditions = as_filters(body.filters) + [c for text in body.where
                                                 for c in parse_where(text)]
        where = ix.fields_where(conditions) if conditions else None
        words = None if body.any_word else (query.word,)
        hits = await batcher.search(ix, query, body.k, words, not body.any_word, where)
        # A JSONResponse of plain values: FastAPI's generic encoder would walk it again.
        return JSONResponse({"index": name, "query": {"tokens": query.tokens,
                                                      "position": query.position,
                                                      "word": query.word},
                             "hits": [hit_json(h, store) for h in hits]})

    # Cached per index build too (``generation``): a rebuilt index answers anew.
    @lru_cache(maxsize=64)  # a word's map holds up to MAX_CONTEXTS points
    def clusters(index_name: str, generation: int, word: str, k: int | str,
                 where: tuple[str, ...]) -> dict[str, Any]:
        _, ix = store.index(index_name)
        filters = [c for text in where for c in parse_where(text)]
        return cluster_json(cluster_senses(ix, [word], k=k, max_k=MAX_CLUSTERS,
                                           filters=filters), store)

    @lru_cache(maxsize=64)
    def timeline(index_name: str, generation: int, word: str, by: str, bin: float | None,
                 k: int | str, where: tuple[str, ...]) -> dict[str, Any]:
        from pipeline.lookup.senses.over_time import sense_timeline

        _, ix = store.index(index_name)
        filters = [c for text in where for c in parse_where(text)]
        return _plain(sense_timeline(ix, word, by, bin, k=k, filters=filters).to_dict())

    # Before /senses/{word}: a word is a path (it may hold a slash), so that route would
    # take ".../change" as part of the word.
    @app.get("/senses/{word:path}/change", summary="the share of each of a word's senses "
             "per group of a document field (per bin of a number field)")
    async def senses_change(word: Annotated[str, PathParam(max_length=MAX_WORD_CHARS)],
                            by: Annotated[str, Query(min_length=1, max_length=200)],
                            bin: Annotated[float | None, Query(gt=0)] = None,
                            k: Annotated[str, Query(pattern=r"^(auto|[1-9][0-9]?)$")] = "auto",
                            where: Annotated[list[str], Query(max_length=MAX_FILTERS)] = [],  # noqa: B006
                            index: str | None = None) -> JSONResponse:
        name, _ = store.index(index)
        chosen = _k(k)
        return JSONResponse(await run_in_threadpool(timeline, name, store.generation,
                                                    word.lower(), by, bin, chosen,
                                                    tuple(where)))

    @app.get("/senses/{word:path}", summary="a word's sense clusters, with a 2-D map")
    async def senses(word: Annotated[str, PathParam(max_length=MAX_WORD_CHARS)],
                     k: Annotated[str, Query(pattern=r"^(auto|[1-9][0-9]?)$")] = "auto",
                     where: Annotated[list[str], Query(max_length=MAX_FILTERS)] = [],  # noqa: B006
                     index: str | None = None) -> dict[str, Any]:
        name, _ = store.index(index)
        return await run_in_threadpool(clusters, name, store.generation, word.lower(), _k(k),
                                       tuple(where))


def _k(k: str) -> int | str:
    """``auto`` or a number of senses up to ``MAX_CLUSTERS``."""
    chosen: int | str = k if k == "auto" else int(k)
    if isinstance(chosen, int) and chosen > MAX_CLUSTERS:
        raise ElmoUserError(f"k must be auto or 1..{MAX_CLUSTERS}")
    return chosen


def _add_data_routes(app: FastAPI, store: ServedStore) -> None:
    @app.get("/occurrences/{word:path}", summary="every use of a word, page by page")
    async def occurrences(word: Annotated[str, PathParam(max_length=MAX_WORD_CHARS)],
                          limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
                          offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
                          index: str | None = None) -> dict[str, Any]:
        name, ix = store.index(index)
        total, hits = await run_in_threadpool(store.occurrences, ix, word, limit, offset)
        return {"index": name, "word": word, "total": total, "offset": offset,
                "occurrences": [hit_json(h, store) for h in hits]}

    # doc_id is a path: a corpus's ids may hold slashes ("spam-2/00099"), which a client
    # sends as %2F and the router sees decoded.
    @app.get("/sentences/{doc_id:path}/{sent_idx}", summary="a sentence and its neighbours")
    async def sentences(doc_id: str, sent_idx: Annotated[int, PathParam(ge=0)],
                        context: Annotated[int, Query(ge=0, le=MAX_CONTEXT)] = 2
                        ) -> dict[str, Any]:
        rows = await run_in_threadpool(store.context, doc_id, sent_idx, context)
        if not any(r["sent_idx"] == sent_idx for r in rows):
            raise LookupError(f"no sentence {sent_idx} in document {doc_id!r}")
        return {"doc_id": doc_id, "sent_idx": sent_idx,
                "document": store.documents.get(doc_id, {}), "sentences": rows}

    @app.post("/sql", summary="one read-only SELECT over the dataset's views")
    async def sql(body: SqlRequest) -> Response:
        # The answer's JSON, written by the SQL worker (sql_worker.py): its bytes only.
        answer = await run_in_threadpool(store.sql.run, body.query, body.params)
        return Response(answer, media_type="application/json")


def cluster_json(result: Any, store: ServedStore) -> dict[str, Any]:
    return {
        "words": result.words, "k": result.k, "auto": result.auto, "mix": result.mix,
        "silhouettes": {str(k): round(v, 4) for k, v in result.silhouettes.items()},
        "rows": result.n_rows, "distinct": result.n_distinct,
        "explained": [round(v, 4) for v in result.explained],
        "clusters": [{"label": c.label, "size": c.size, "name": c.name(),
                      "phrases": c.phrases, "keywords": c.keywords,
                      "examples": [hit_json(h, store) for h in c.examples]}
                     for c in result.clusters],
        "points": [{"x": round(float(x), 5), "y": round(float(y), 5), "cluster": int(label),
                    "doc_id": h.doc_id, "sent_idx": h.sent_idx, "tok_idx": h.tok_idx,
                    "token": h.token,
                    # Marked with control characters: the page escapes the text, then
                    # turns them into bold.
                    "snippet": h.snippet(120, "\u0002", "\u0003")}
                   for (x, y), label, h in zip(result.points, result.labels,
                                               result.occurrences, strict=True)],
    }


class GuardMiddleware:
    """Bearer token (when set) and body size, checked before a route sees the request."""

    def __init__(self, app: Callable[..., Awaitable[None]], token: str | None,
                 max_body: int, batcher: Batcher) -> None:
        self.app, self.max_body, self.batcher = app, max_body, batcher
        self.expected = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any],
                       send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self.expected is not None and not hmac.compare_digest(
                headers.get(b"authorization", b""), self.expected):
            await _send(send, error(401, "send Authorization: Bearer <token> (the server's "
                                         "--token)"))
            return
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_body:
            await _send(send, error(413, f"request body over {self.max_body} bytes"))
            return
        seen = 0

        async def limited() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:  # a chunked body that lied about nothing
                raise HTTPException(413, f"request body over {self.max_body} bytes")
            return message

        # The batcher waits for others only while other requests are under way.
        self.batcher.requests_in_flight += 1
        try:
            await self.app(scope, limited, send)
        finally:
            self.batcher.requests_in_flight -= 1


async def _send(send: Callable[..., Any], response: JSONResponse) -> None:
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})
