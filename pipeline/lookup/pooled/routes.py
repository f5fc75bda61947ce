"""``POST /passages/search`` on ``elmo serve``: ``elmo search passages`` over HTTP. The
pooled tables are read on first use and held; the query's layers come from the server's
batcher (so they share model calls with the other routes' sentences)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from elmo_model.errors import ElmoUserError
from pipeline.lookup.pooled.pooling import DEFAULT_METHOD, DEFAULT_MIX, METHODS
from pipeline.lookup.pooled.search import PassageSearch, passage_vector, query_tokens
from pipeline.lookup.serve.limits import (
    MAX_FILTERS,
    MAX_K,
    MAX_SENTENCE_CHARS,
    MAX_SENTENCES,
)

Scalar = str | int | float | bool


class PassageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=4 * MAX_SENTENCE_CHARS)
    k: int = Field(10, ge=1, le=MAX_K)
    by: Literal["sentence", "document"] = "sentence"
    mix: str = Field(DEFAULT_MIX, min_length=1, max_length=200,
                     description="the pooled table's mix (a named mix)")
    method: str = Field(DEFAULT_METHOD, description=f"one of {', '.join(METHODS)}")
    filters: dict[str, Scalar | Annotated[list[Scalar | None], Field(max_length=20)]] | None = \
        Field(None, max_length=MAX_FILTERS, description="document fields, as for "
              "/senses/search")
    where: list[Annotated[str, Field(min_length=1, max_length=500)]] = Field(
        default_factory=list, max_length=MAX_FILTERS,
        description="conditions as `elmo search passages --where` writes them")


def add_passage_routes(app: FastAPI, store: Any, batcher: Any) -> None:
    """The route, over ``store``'s dataset (a ``ServedStore``) and ``batcher``."""
    search = PassageSearch(store.ds)

    @app.post("/passages/search", summary="the stored sentences or documents nearest to a "
              "text (pooled vectors, `elmo pool`)")
    async def passages_search(body: PassageRequest) -> JSONResponse:
        pooled = await run_in_threadpool(search.pooled, body.by, body.mix, body.method)
        keep = await run_in_threadpool(search.allowed, body.where, body.filters)
        sentences = query_tokens(body.text, store.tokenizer)
        if len(sentences) > MAX_SENTENCES:
            raise ElmoUserError(f"the text has {len(sentences)} sentences; at most "
                                f"{MAX_SENTENCES}")
        layers = await batcher.embed(sentences)
        vector = passage_vector(layers, store.ds, body.mix, body.method)
        hits = await run_in_threadpool(search.nearest, pooled, vector, body.k, keep)
        return JSONResponse({"by": body.by, "mix": pooled.mix, "method": pooled.method,
                             "rows": len(pooled), "query": {"tokens": sentences},
                             "hits": [hit.to_dict() for hit in hits]})
