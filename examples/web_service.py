# examples/web_service.py
"""A web service that enqueues work: one bucketq.Queue per process, opened in the app's lifespan, shared by
every request, drained and closed on shutdown. Run it with

    BUCKETQ_MONGODB_URI=mongodb://localhost:27017/shop uvicorn web_service:app --app-dir examples
"""

import contextlib
import os
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request

import bucketq


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    uri = os.environ.get("BUCKETQ_MONGODB_URI", "mongodb://localhost:27017/shop")
    async with bucketq.Queue(uri, name="orders") as queue:  # connected before the first request
        app.state.orders = queue
        yield  # serving; on shutdown, once the requests in flight are answered, leaving the block drains and closes


app = FastAPI(lifespan=lifespan)


@app.post("/orders", status_code=202)
async def create_order(order: dict, request: Request) -> dict:
    message_id = await request.app.state.orders.push(order)  # returns once the message is stored
    return {"id": message_id}
