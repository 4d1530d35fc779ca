# examples/dashboard_mount.py
"""The dashboard mounted in a service of yours, at /bucketq: read-only, its charts sampled while the service
runs (the service's lifespan runs the dashboard's). Run it with

    BUCKETQ_MONGODB_URI=mongodb://localhost:27017/shop uvicorn dashboard_mount:app --app-dir examples
"""

import contextlib
import os
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request

import bucketq
from bucketq.web import create_app

uri = os.environ.get("BUCKETQ_MONGODB_URI", "mongodb://localhost:27017/shop")
dashboard = create_app(uri)  # add token=..., allow_actions=True for the operator actions


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with dashboard.router.lifespan_context(dashboard), bucketq.Queue(uri, name="orders") as queue:
        app.state.orders = queue
        yield


app = FastAPI(lifespan=lifespan)
app.mount("/bucketq", dashboard)


@app.post("/orders", status_code=202)
async def create_order(order: dict, request: Request) -> dict:
    return {"id": await request.app.state.orders.push(order)}
