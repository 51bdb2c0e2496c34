"""The baseline for bench/intake: a FastAPI endpoint that reads the body and answers, nothing more."""

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

app = FastAPI()


@app.post("/webhooks/gitlab")
async def noop(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse({"outcome": "noop"}, status_code=200)
