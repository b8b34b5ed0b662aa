#!/usr/bin/env python3
"""`florence2 serve` driven by the official `openai` Python client (installed by scripts/setup.sh into
scripts/.cache/venv; scripts/test.sh runs this file with that interpreter).

Starts the server on a free loopback port with the tiny4 fixture model, then checks, through the client:
- `client.chat.completions.create(...)` with a data-URL image: the parsed message's content and the
  `florence2_result` extension read from the raw HTTP response equal `florence2 run --json` on the same
  case (token ids, rendered text, post-processed result);
- the same request streamed (`stream=True`, usage included): the joined deltas equal the content and the
  delta extension carries the same `florence2_result`;
- `client.models.list()`, a 400 (`BadRequestError`, invalid prompt), a 404 (`NotFoundError`, another
  model's name), a plain-text prompt (the default task, named in `florence2_result.default_task`), a 401
  (`AuthenticationError`, with an API key set), and SIGTERM -> exit status 0.

Usage: python scripts/ci/test_openai_client.py [--bin target/debug/florence2]
"""

import argparse
import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
MODEL = FIXTURES / "models" / "tiny4"


class Server:
    def __init__(self, binary, *args):
        env = dict(os.environ, NODEVICE_SELECT="1")
        env.pop("FLORENCE2_API_KEY", None)
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", str(MODEL), "--port", "0", *args],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        line = self.proc.stdout.readline()
        if "http://" not in line:
            raise SystemExit(f"no listening line from the server: {line!r}")
        self.base = line.strip().rsplit(" ", 1)[-1]
        for _ in range(1200):  # bounded: 120 s
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise SystemExit("server not ready after 120 s")

    def terminate(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def data_url(name):
    kind = "png" if name.endswith(".png") else "jpeg"
    payload = base64.b64encode((FIXTURES / "images" / name).read_bytes()).decode()
    return f"data:image/{kind};base64,{payload}"


def messages(prompt, image):
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": prompt},
                {"type": "image_url", "image_url": {"url": data_url(image)}},
            ],
        }
    ]


def cli_run(binary, image, task, text, max_new, beams):
    cmd = [binary, "run", "--model", str(MODEL), "--image", str(FIXTURES / "images" / image),
           "--task", task, "--max-new-tokens", str(max_new), "--num-beams", str(beams), "--json"]
    if text:
        cmd += ["--text", text]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=dict(os.environ, NODEVICE_SELECT="1"))
    return json.loads(out.stdout)


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok - {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target" / "debug" / "florence2"))
    args = ap.parse_args()
    cases = json.loads((FIXTURES / "reference" / "tiny4" / "cases.json").read_text())
    by_task = {c["task"]: c for c in cases}

    server = Server(args.bin)
    try:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)
        models = client.models.list()
        check([m.id for m in models.data] == ["tiny4"], "models.list() names the fixture model")

        for task, beams in [("<OD>", 3), ("<CAPTION_TO_PHRASE_GROUNDING>", 1), ("<CAPTION>", 1)]:
            c = by_task[task]
            prompt = c["task"] + c["text_input"]
            cli = cli_run(args.bin, c["image"], c["task"], c["text_input"], c["max_new_tokens"], beams)
            raw = client.chat.completions.with_raw_response.create(
                model="tiny4",
                messages=messages(prompt, c["image"]),
                max_tokens=c["max_new_tokens"],
                extra_body={"num_beams": beams},
            )
            completion = raw.parse()
            body = json.loads(raw.http_response.text)
            f2 = body["choices"][0]["message"]["florence2_result"]
            msg = completion.choices[0].message
            check(msg.content == cli["text"], f"{task}: content equals florence2 run")
            check(f2["token_ids"] == cli["token_ids"], f"{task}: token ids equal florence2 run")
            check(f2["result"] == cli["result"], f"{task}: florence2_result equals florence2 run")
            check(f2["task"] == task, f"{task}: florence2_result names the task")
            check((msg.model_extra or {}).get("florence2_result") == f2,
                  f"{task}: the parsed message keeps the extension field")
            check(completion.usage.completion_tokens == len(cli["token_ids"]) - 1,
                  f"{task}: usage counts the generated tokens")

            stream = client.chat.completions.create(
                model="tiny4",
                messages=messages(prompt, c["image"]),
                max_tokens=c["max_new_tokens"],
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"num_beams": beams},
            )
            content, streamed, finish, usage = "", None, None, None
            for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    content += choice.delta.content or ""
                    extra = choice.delta.model_extra or {}
                    if "florence2_result" in extra:
                        streamed = extra["florence2_result"]
                    finish = choice.finish_reason or finish
            check(content == cli["text"], f"{task}: streamed content equals florence2 run")
            check(streamed == f2, f"{task}: streamed florence2_result equals the non-streamed one")
            check(finish == completion.choices[0].finish_reason, f"{task}: same finish reason")
            check(usage is not None and usage.total_tokens == completion.usage.total_tokens,
                  f"{task}: streamed usage equals the non-streamed usage")

        try:
            client.chat.completions.create(model="tiny4", messages=messages("<NOPE>", "scene.png"))
            check(False, "an unknown task is refused")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and e.code == "invalid_prompt", "unknown task -> BadRequestError 400")
            check("<CAPTION>" in e.message, "the 400 lists the valid tasks")
        try:
            client.chat.completions.create(model="gpt-4o", messages=messages("<OD>", "scene.png"))
            check(False, "another model's name is refused")
        except openai.NotFoundError as e:
            check(e.status_code == 404 and e.code == "model_not_found", "unknown model -> NotFoundError 404")
        # A generic client's plain question runs --default-task and says so.
        raw = client.chat.completions.with_raw_response.create(
            model="tiny4", messages=messages("What is in this picture?", "scene.png"), max_tokens=4,
            extra_body={"num_beams": 1})
        f2 = json.loads(raw.http_response.text)["choices"][0]["message"]["florence2_result"]
        check(f2["task"] == "<MORE_DETAILED_CAPTION>" and f2["default_task"]["task"] == f2["task"],
              "a plain-text prompt runs the default task and says so")
        code = server.terminate()
        check(code == 0, "SIGTERM -> exit status 0")
    finally:
        server.kill()

    keyed = Server(args.bin, "--api-key", "k3y")
    try:
        bad = openai.OpenAI(base_url=keyed.base + "/v1", api_key="wrong", max_retries=0)
        try:
            bad.models.list()
            check(False, "a wrong key is refused")
        except openai.AuthenticationError as e:
            check(e.status_code == 401, "wrong API key -> AuthenticationError 401")
        good = openai.OpenAI(base_url=keyed.base + "/v1", api_key="k3y", max_retries=0)
        out = good.chat.completions.create(model="tiny4", messages=messages("<CAPTION>", "scene.png"),
                                           max_tokens=4)
        check(out.choices[0].message.role == "assistant", "the right key is accepted")
    finally:
        keyed.kill()
    print("openai client test: all passed")


if __name__ == "__main__":
    sys.exit(main())
