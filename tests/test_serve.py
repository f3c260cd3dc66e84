"""`mlxmem serve` with the official openai client as a real client, over the deterministic
FakeEngine: the OpenAI endpoints, the memory API, many clients, disconnects, bad input."""

import base64
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest
from conftest import cli, files_containing
from serve_helpers import MODEL, assert_error, fake_server, request

from mlxmem.errors import InputError
from mlxmem.memory.companion import INSTRUCTIONS
from mlxmem.memory.store import Store
from mlxmem.serve import ServeConfig, check_binding, make_server
from mlxmem.serve.http import RequestHandler
from mlxmem.testing import FakeEngine

LONG_REPLY = " ".join(f"word{i}" for i in range(200))


def client(server, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, **kwargs)


def ask(server, text, **kwargs):
    return client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], **kwargs
    )


def streamed(server, text, **kwargs) -> tuple[str, list]:
    chunks = list(
        client(server).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": text}],
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def log(conversation="default"):
    return [(t.role, t.text) for t in Store().turns(conversation)]


def test_models_lists_the_served_model():
    with fake_server() as server:
        models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_a_request_is_one_logged_turn_with_openai_usage():
    engine = FakeEngine()
    with fake_server(engine) as server:
        first = ask(server, "Hello there")
        second = ask(server, "How are you?")
    assert first.choices[0].message.content == "I hear you."
    assert first.choices[0].finish_reason == "stop"
    assert log() == [("user", "Hello there"), ("assistant", "I hear you.")] * 1 + [
        ("user", "How are you?"),
        ("assistant", "I hear you."),
    ]
    usage = second.usage
    assert usage.prompt_tokens == engine.calls[-1].prompt_tokens
    assert usage.completion_tokens == len(engine.encode_text("I hear you.")) + 1  # + end of turn
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # The second turn reuses the first one's prefix: only its own message is prefilled.
    assert usage.prompt_tokens_details.cached_tokens == engine.calls[-1].cached_tokens > 0


def test_streaming_sends_chunks_then_usage_and_logs_the_reply():
    with fake_server(FakeEngine(lambda prompt: LONG_REPLY[:60])) as server:
        first, _ = streamed(server, "Tell me something")
        second, chunks = streamed(server, "And more?")
    assert first == second == LONG_REPLY[:60]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 5
    assert chunks[-2].choices[0].finish_reason == "stop"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.prompt_tokens_details.cached_tokens > 0
    assert log()[-1] == ("assistant", LONG_REPLY[:60])


def test_the_response_ends_before_the_memory_work_and_the_next_tells_the_fact_noted():
    gate: queue.Queue = queue.Queue()  # the fake model notes each fact once the test lets it
    facts = iter(["The user keeps bees.", "The user sells honey at the market."])

    def model(prompt: str) -> str:
        if "durable facts" in prompt:
            gate.get(timeout=30)
            return next(facts)
        return "I hear you."

    long = "I keep three hives of bees in my garden behind the house, {}."
    with fake_server(FakeEngine(model), extract_facts=True) as server:
        # The response ends while the fact is still being looked for...
        first = ask(server, long.format("near the apple trees"))
        assert first.choices[0].message.content == "I hear you."
        assert first.model_extra["mlxmem"]["fact_added"] is None
        assert Store().facts() == []
        gate.put("go")
        # (Noted before the next request comes: one that came sooner would postpone it.)
        wait_for(lambda: Store().facts())
        # ...and so does a stream, [DONE] included; it tells the fact the previous message
        # gave, noted after the previous response.
        text, chunks = streamed(server, long.format("and I sell the honey at the market"))
        assert text == "I hear you." and chunks[-1].usage is not None
        told = [c.model_extra["mlxmem"] for c in chunks if "mlxmem" in (c.model_extra or {})]
        assert told[0]["fact_added"] == {"id": 1, "text": "The user keeps bees.", "replaces": None}
        assert [f.text for f in Store().facts()] == ["The user keeps bees."]
        gate.put("go")
        wait_for(lambda: len(Store().facts()) == 2)
        third = ask(server, "Thanks!")
    told = third.model_extra["mlxmem"]["fact_added"]
    assert told["text"] == "The user sells honey at the market."
    assert log()[-2:] == [("user", "Thanks!"), ("assistant", "I hear you.")]


def test_the_conversation_comes_from_the_header_or_the_user_field():
    engine = FakeEngine()
    with fake_server(engine) as server:
        ask(server, "to work", user="work")
        client(server, default_headers={"X-Mlxmem-Conversation": "home"}).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "to home"}]
        )
        ask(server, "to default")
        both = request(
            server,
            "POST",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "user": "a"},
            {"X-Mlxmem-Conversation": "b"},
        )
    assert [c.slot for c in engine.calls] == ["work/chat", "home/chat", "default/chat"]
    assert log("work")[0] == ("user", "to work") and log("home")[0] == ("user", "to home")
    assert log("default")[0] == ("user", "to default")
    assert_error(both, 400, "conversation_mismatch")


def test_mlxmem_keeps_the_history_and_refuses_a_contradicting_one():
    engine = FakeEngine()
    with fake_server(engine) as server:
        chat = client(server).chat.completions
        pirate = {"role": "system", "content": "You are a pirate."}
        chat.create(model=MODEL, messages=[pirate, {"role": "user", "content": "I like tea"}])
        # The client's own copy of the conversation, as most clients send it: accepted.
        history = [
            pirate,
            {"role": "user", "content": "I like tea"},
            {"role": "assistant", "content": "I hear you."},
            {"role": "user", "content": "And coffee"},
        ]
        chat.create(model=MODEL, messages=history)
        answered = [*history, {"role": "assistant", "content": "I hear you."}]
        edited = [answered[0], {"role": "user", "content": "I like beer"}, *answered[2:]]
        edited.append({"role": "user", "content": "Which?"})
        with pytest.raises(openai.ConflictError) as conflict:
            chat.create(model=MODEL, messages=edited)
        longer = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}] * 3
        with pytest.raises(openai.ConflictError):
            chat.create(model=MODEL, messages=[*longer, {"role": "user", "content": "?"}])
    assert conflict.value.body["code"] == "history_conflict"
    assert "I like tea" in conflict.value.body["message"]
    # Each request logged exactly its last message; the refused ones logged nothing.
    assert [text for role, text in log() if role == "user"] == ["I like tea", "And coffee"]
    # The client's system prompt is ignored: mlxmem's instructions head every prompt.
    assert all("pirate" not in c.prompt and INSTRUCTIONS in c.prompt for c in engine.calls)
    # The second prompt holds the first exchange once, from the log, not twice.
    assert engine.calls[-1].prompt.count("I like tea") == 1


def test_two_clients_at_once_are_served_in_turn_on_the_model_thread():
    threads_seen = []

    def responder(prompt):
        threads_seen.append(threading.current_thread().name)
        return LONG_REPLY[:80]

    results = {}
    with fake_server(FakeEngine(responder, delay_s=0.005)) as server:

        def talk(name):
            results[name] = [
                streamed(server, f"hello from {name} {i}", user=name)[0] for i in (1, 2)
            ]

        workers = [threading.Thread(target=talk, args=(n,)) for n in ("ana", "rui")]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
    assert results == {"ana": [LONG_REPLY[:80]] * 2, "rui": [LONG_REPLY[:80]] * 2}
    assert threads_seen == ["mlxmem-model"] * 4  # one thread owns the model
    for name in ("ana", "rui"):
        assert log(name) == [
            ("user", f"hello from {name} 1"),
            ("assistant", LONG_REPLY[:80]),
            ("user", f"hello from {name} 2"),
            ("assistant", LONG_REPLY[:80]),
        ]


def wait_for(check, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_an_abandoned_stream_stops_the_reply_and_keeps_it_as_interrupted():
    engine = FakeEngine(lambda prompt: LONG_REPLY, delay_s=0.03)
    with fake_server(engine) as server:
        stream = client(server).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Talk to me"}], stream=True
        )
        seen = "".join(next(stream).choices[0].delta.content for _ in range(4))
        stream.close()
        turns = wait_for(lambda: [t for t in Store().turns("default") if t.role == "assistant"])
        # The server goes on serving.
        after = ask(server, "Still there?", max_tokens=3)
    reply = turns[0]
    assert reply.interrupted
    assert reply.text.startswith(seen) and len(reply.text) < len(LONG_REPLY) // 2
    assert after.choices[0].finish_reason == "length"
    assert log()[-2:] == [("user", "Still there?"), ("assistant", after.choices[0].message.content)]


def test_bad_requests_get_openai_errors_and_the_server_lives_on():
    with fake_server(max_message_chars=1000) as server:
        chat = client(server).chat.completions
        with pytest.raises(openai.BadRequestError):
            chat.create(model=MODEL, messages=[])
        with pytest.raises(openai.NotFoundError) as unknown:
            chat.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert unknown.value.body["code"] == "model_not_found"
        with pytest.raises(openai.BadRequestError) as too_long:
            chat.create(model=MODEL, messages=[{"role": "user", "content": "x" * 1001}])
        assert "nothing was logged" in too_long.value.body["message"]
        with pytest.raises(openai.APIStatusError) as huge:
            chat.create(model=MODEL, messages=[{"role": "user", "content": "x" * 10_000_000}])
        assert huge.value.status_code == 413
        assert huge.value.body["code"] == "request_too_large"
        post = "/v1/chat/completions"
        bad = [
            ({"messages": "hello"}, "messages"),
            ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
            ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
            ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, None),
            ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
            ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
            ({"messages": [{"role": "assistant", "content": "x"}]}, "messages"),
            ({"messages": [{"role": "user", "content": "   "}]}, None),
        ]
        for body, param in bad:
            error = assert_error(request(server, "POST", post, body), 400)
            assert param is None or error["param"] == param, error
        seeded = {"messages": [{"role": "user", "content": "x"}], "seed": -1}
        assert_error(request(server, "POST", post, seeded), 400, "invalid_value")
        assert_error(request(server, "POST", post, b"[" * 100_000), 400, "invalid_json")
        assert_error(request(server, "PUT", post, b"{}"), 405, "method_not_allowed")
        assert_error(request(server, "GET", "/v1/memory/search?q=x&limit=%C2%B2"), 400)
        assert_error(request(server, "POST", post, b"{not json"), 400, "invalid_json")
        assert_error(request(server, "POST", post, b"[1, 2]"), 400, "invalid_json")
        assert_error(request(server, "GET", "/v1/nothing"), 404, "not_found")
        assert_error(request(server, "DELETE", post), 405, "method_not_allowed")
        assert_error(request(server, "GET", "/v1/memory/facts/123"), 405)
        assert_error(request(server, "DELETE", "/v1/memory/facts/123"), 404, "not_found")
        assert request(server, "GET", "/v1/models")[0] == 200
        assert ask(server, "still alive?").choices[0].message.content == "I hear you."
    assert [text for role, text in log() if role == "user"] == ["still alive?"]


def test_a_huge_body_is_refused_by_its_declared_length_before_it_is_read():
    with fake_server() as server:
        url = urlsplit(server.url)
        with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 10000000\r\n\r\n{"
            )
            # Nothing more is sent: the answer comes anyway, from the header alone, and the
            # server ends its side of the connection.
            answer = b""
            while part := sock.recv(4096):
                answer += part
            answer = answer.decode()
        assert answer.startswith("HTTP/1.1 413") and "request_too_large" in answer
        assert request(server, "GET", "/v1/models")[0] == 200


def test_an_integer_of_5000_digits_is_a_400_not_a_traceback(capsys):
    with fake_server() as server:
        body = b'{"messages": [{"role": "user", "content": "x"}], "seed": ' + b"9" * 5000 + b"}"
        error = assert_error(request(server, "POST", "/v1/chat/completions", body), 400)
        assert error["code"] == "invalid_json" and "digits" in error["message"]
        assert request(server, "GET", "/v1/models")[0] == 200
    assert "Traceback" not in capsys.readouterr().err


def raw(server, data: bytes, pause: float = 0.0, pieces: int = 1) -> str:
    """Send `data` on a new connection in `pieces`, `pause` seconds apart; the whole answer."""
    url = urlsplit(server.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        step = -(-len(data) // pieces)
        try:
            for i in range(0, len(data), step):
                sock.sendall(data[i : i + step])
                time.sleep(pause)
        except OSError:
            pass  # the server closed the connection on us
        answer = b""
        try:
            while part := sock.recv(4096):
                answer += part
        except OSError:
            pass
        return answer.decode()


def test_two_content_length_headers_are_refused():
    with fake_server() as server:
        answer = raw(
            server,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 40\r\n"
            b"\r\n{}",
        )
        assert answer.startswith("HTTP/1.1 400") and "two Content-Length" in answer
        assert request(server, "GET", "/v1/models")[0] == 200
        # The first says 0: what follows must not be read as a second request on the connection.
        smuggled = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        answer = raw(
            server,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 0\r\n"
            + f"Content-Length: {len(smuggled)}\r\n\r\n".encode()
            + smuggled,
        )
        assert answer.startswith("HTTP/1.1 400") and answer.count("HTTP/1.1 ") == 1, answer


def test_a_request_that_trickles_in_is_cut_off_at_its_deadline(monkeypatch):
    from mlxmem.serve.http import RequestHandler

    monkeypatch.setattr(RequestHandler, "request_deadline", 1.0)
    with fake_server() as server:
        start = time.monotonic()
        # A byte every 0.3 s: each read is quick, the whole request never arrives in time.
        answer = raw(server, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 30,
                     pause=0.3, pieces=30)  # fmt: skip
        assert time.monotonic() - start < 6 and answer == ""
        # A request that arrives whole in time is answered, and its reply is not timed.
        assert request(server, "GET", "/v1/models")[0] == 200
        assert ask(server, "still here?").choices[0].message.content == "I hear you."


def test_memory_api_facts_round_trip_into_the_next_prompt_and_gone_for_good():
    engine = FakeEngine()
    with fake_server(engine) as server:
        status, fact, _ = request(server, "POST", "/v1/memory/facts", {"text": "I keep bees"})
        assert status == 201 and fact["source"] == "manual" and fact["text"] == "I keep bees"
        ask(server, "Hello")
        assert "- I keep bees" in engine.calls[-1].prompt
        path = f"/v1/memory/facts/{fact['id']}"
        status, edited, _ = request(server, "PATCH", path, {"text": "I keep wasps"})
        assert status == 200 and edited["text"] == "I keep wasps"
        listed = request(server, "GET", "/v1/memory/facts")[1]["data"]
        assert [(f["id"], f["text"], f["source"]) for f in listed] == [
            (fact["id"], "I keep wasps", "manual")
        ]
        status, deletion, _ = request(server, "DELETE", path)
        assert status == 200 and deletion["message"] == "Deleted 1 fact."
        assert deletion["facts"][0]["text"] == "I keep wasps"
        ask(server, "Still?")
        assert "wasps" not in engine.calls[-1].prompt and "bees" not in engine.calls[-1].prompt
        assert_error(request(server, "DELETE", path), 404, "not_found")
        assert_error(request(server, "PATCH", path, {"text": "x"}), 404)
        assert_error(request(server, "POST", "/v1/memory/facts", {"text": 3}), 400)
        assert_error(request(server, "POST", "/v1/memory/facts", {"text": " "}), 400)
        request(server, "POST", "/v1/memory/facts", {"text": "I keep bees"})
        twice = request(server, "POST", "/v1/memory/facts", {"text": "i keep bees."})
        assert_error(twice, 409, "duplicate_fact")
        assert "already says that: 'I keep bees'" in twice[1]["error"]["message"]
        bees = Store().facts()[-1].id
        moved = request(
            server, "POST", "/v1/memory/facts", {"text": "I keep wasps", "replaces": bees}
        )
        assert moved[0] == 201
        assert [f["text"] for f in request(server, "GET", "/v1/memory/facts")[1]["data"]].count(
            "I keep bees"
        ) == 0
        listed = request(server, "GET", "/v1/memory/facts?all=true")[1]["data"]
        assert (
            next(f for f in listed if f["text"] == "I keep bees")["replaced_by"] == moved[1]["id"]
        )
        bad = request(server, "POST", "/v1/memory/facts", {"text": "x y", "replaces": "1"})
        assert_error(bad, 400, "invalid_value")
        # A replacement made in error: the old fact is current again, the new one stays.
        restored = request(server, "POST", f"/v1/memory/facts/{bees}/restore", {})
        assert restored[0] == 200 and restored[1]["replaced_by"] is None
        current = [f["text"] for f in request(server, "GET", "/v1/memory/facts")[1]["data"]]
        assert current == ["I keep bees", "I keep wasps"]
        assert_error(request(server, "POST", f"/v1/memory/facts/{bees}/restore", {}), 400)
        assert_error(request(server, "POST", "/v1/memory/facts/999/restore", {}), 404)
        Store().delete_facts([f.id for f in Store().facts(replaced=True)])
    assert Store().facts(replaced=True) == []
    home = Store().path.parent
    assert files_containing(home, "keep bees") == files_containing(home, "keep wasps") == []


def test_memory_api_history_show_search_and_delete_like_the_cli():
    with fake_server() as server:
        for text in ["one apple", "two pears", "three apples"]:
            ask(server, text, user="fruit")
        ask(server, "other", user="misc")
        names = request(server, "GET", "/v1/memory/conversations")[1]["data"]
        assert [(c["name"], c["turn_count"]) for c in names] == [("fruit", 6), ("misc", 2)]
        turns = request(server, "GET", "/v1/memory/conversations/fruit")[1]["data"]
        assert [t["text"] for t in turns[::2]] == ["one apple", "two pears", "three apples"]
        assert "sampled_ids" not in turns[1]  # the CLI's record: no internal fields
        last = request(server, "GET", "/v1/memory/conversations/fruit?last=2")[1]["data"]
        assert last == turns[-2:]
        found = request(server, "GET", "/v1/memory/search?q=apple")[1]["data"]
        assert [t["text"] for t in found] == ["three apples", "one apple"]
        status, gone, _ = request(server, "DELETE", f"/v1/memory/turns/{turns[0]['id']}")
        assert status == 200 and gone["turns"] == [turns[0]["id"]]
        status, gone, _ = request(server, "DELETE", "/v1/memory/conversations/fruit?from=3&to=4")
        assert gone["turns"] == [turns[2]["id"], turns[3]["id"]]
        assert request(server, "DELETE", "/v1/memory/conversations/misc")[1]["conversations"] == [
            "misc"
        ]
        assert_error(request(server, "GET", "/v1/memory/conversations/misc"), 404, "not_found")
        assert_error(request(server, "GET", "/v1/memory/search"), 400, "missing_parameter")
        assert_error(request(server, "GET", "/v1/memory/conversations/fruit?last=x"), 400)
        assert_error(request(server, "DELETE", "/v1/memory/conversations/fruit?from=9"), 404)
    assert [t.text for t in Store().turns("fruit")] == [
        "I hear you.",
        "three apples",
        "I hear you.",
    ]
    assert [c.name for c in Store().conversations()] == ["fruit"]


def test_context_shows_the_layers_like_chat_context():
    with fake_server() as server:
        before = request(server, "GET", "/v1/memory/context")[1]
        request(server, "POST", "/v1/memory/facts", {"text": "My cat is Miso"})
        ask(server, "Hello")
        after = request(server, "GET", "/v1/memory/context?conversation=default")[1]
        draft = request(server, "GET", "/v1/memory/context?draft=What+about+my+cat")[1]
        Store().add_summary("default", "Hello and a cat.", 1, 2, 5, source="extractive")
        folded = request(server, "GET", "/v1/memory/context")[1]
    layers = ["instructions", "facts", "summary", "turns", "recall", "reserve", "free"]
    assert before["summary"] is None and after["summary"] is None
    assert folded["summary"] == {"first_seq": 1, "last_seq": 2, "source": "extractive", "tokens": 5}
    assert list(before["layers"]) == layers and before["budget"] == 1024
    assert sum(after["layers"].values()) == 1024
    assert before["layers"]["facts"] == 0 < after["layers"]["facts"]
    assert before["layers"]["turns"] < after["layers"]["turns"] < draft["layers"]["turns"]


def test_a_deletion_drops_other_conversations_slots_before_the_next_turn():
    engine = FakeEngine()
    with fake_server(engine) as server:
        for name in ("a", "b"):
            ask(server, f"secret of {name}", user=name)
        assert {"a/chat", "b/chat"} <= set(engine.slots)
        request(server, "DELETE", "/v1/memory/conversations/a")  # through the server
        ask(server, "next", user="b")
        assert "a/chat" not in engine.slots and "b/chat" in engine.slots
        ask(server, "secret of c", user="c")
        Store().delete_turns([Store().turns("c")[0].id])  # as `mlxmem history rm` would
        assert "c/chat" in engine.slots
        ask(server, "and next", user="b")
        assert "c/chat" not in engine.slots and "b/chat" in engine.slots
    # The dropped slots held deleted text in memory, for as long as the server ran.


def test_conversations_kept_in_memory_are_capped_least_recently_used_first():
    prompts = []
    engine = FakeEngine(lambda prompt: prompts.append(prompt) or "ok")
    with fake_server(engine) as server:
        sessions = server.app.service.sessions
        sessions.limit = 2
        for name in ("a", "b", "c"):
            ask(server, f"hello {name}", user=name)
        assert sessions.names() == ["b", "c"]
        assert "a/chat" not in engine.slots  # went with its companion: no deletion misses it
        ask(server, "back again", user="a")  # rebuilt from the log, history intact
        assert sessions.names() == ["c", "a"]
        assert [text for _, text in log("a")] == ["hello a", "ok", "back again", "ok"]
        assert "hello a" in prompts[-1] and "back again" in prompts[-1]
        request(server, "DELETE", "/v1/memory/conversations/c")
        ask(server, "after the deletion", user="a")
        assert sessions.names() == ["a"]  # the others' copies of the log went with their slots


def test_a_memory_edit_from_the_cli_takes_effect_at_the_next_turn():
    engine = FakeEngine()
    env = {**os.environ, "MLXMEM_NO_OPENBLAS": "1"}

    def mlxmem(*args):
        out = subprocess.run(
            [sys.executable, "-m", "mlxmem.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    with fake_server(engine) as server:
        ask(server, "Hello")
        mlxmem("memory", "add", "I play the cello")
        ask(server, "Guess my instrument")
        assert "- I play the cello" in engine.calls[-1].prompt
        fact_id = Store().facts()[0].id
        mlxmem("memory", "rm", str(fact_id))
        ask(server, "And now?")
        assert "cello" not in engine.calls[-1].prompt.split("Guess my")[0]
        assert "Deleted 1 turn" in mlxmem("history", "rm", str(Store().turns("default")[0].id))
        ask(server, "Last one")
    assert "Hello" not in engine.calls[-1].prompt


def test_with_a_token_every_endpoint_needs_it():
    with fake_server(token="s3cret") as server:
        for path in ["/", "/static/app.js", "/v1/models", "/v1/memory/facts"]:
            status, body, headers = request(server, "GET", path)
            assert status == 401 and body["error"]["type"] == "authentication_error", path
        assert request(server, "GET", "/")[2]["WWW-Authenticate"].startswith("Basic")
        assert request(server, "GET", "/v1/models")[2]["WWW-Authenticate"] == "Bearer"
        wrong = {"Authorization": "Bearer nope"}
        assert request(server, "GET", "/v1/memory/facts", headers=wrong)[0] == 401
        basic = base64.b64encode(b"me:s3cret").decode()
        assert request(server, "GET", "/", headers={"Authorization": f"Basic {basic}"})[0] == 200
        with pytest.raises(openai.AuthenticationError):
            ask(server, "hi")
        good = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
        reply = good.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    assert reply.choices[0].message.content == "I hear you."


def test_listening_beyond_loopback_needs_a_flag_and_a_token():
    for host in ["127.0.0.1", "::1", "localhost", "127.0.0.2"]:
        check_binding(host, allow_remote=False, token=None)
    with pytest.raises(InputError, match="--allow-remote"):
        check_binding("0.0.0.0", allow_remote=False, token="t")
    with pytest.raises(InputError, match="token"):
        check_binding("192.168.1.5", allow_remote=True, token=None)
    check_binding("0.0.0.0", allow_remote=True, token="t")
    result = cli("serve", "--host", "0.0.0.0", "--model", "tiny", code=1)
    assert "--allow-remote" in result.output


def test_the_page_and_its_files_are_served():
    with fake_server() as server:
        status, page, headers = request(server, "GET", "/")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        # Its delete buttons cannot be clickjacked: no other site may frame the page.
        assert headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
        assert b'<script src="/static/app.js">' in page
        status, script, _ = request(server, "GET", "/static/app.js")
        assert status == 200 and b"/v1/chat/completions" in script
        status, style, _ = request(server, "GET", "/static/style.css")
        assert status == 200 and b".bar" in style
        # Nothing from elsewhere (no CDN): the page works offline.
        assert not any(b"http://" in f or b"https://" in f for f in (page, script, style))
        assert_error(request(server, "GET", "/static/secrets.txt"), 404)
        assert_error(request(server, "GET", "/static/..%2Fhttp.py"), 404)


def test_a_taken_port_fails_before_the_model_loads():
    loads = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = ServeConfig(MODEL, 1024, 128)
        with pytest.raises(OSError):
            make_server(lambda: loads.append(1) or FakeEngine(), config, port=port)
    assert loads == []


def test_a_request_whose_client_leaves_while_it_waits_is_dropped():
    engine = FakeEngine(lambda prompt: LONG_REPLY, delay_s=0.03)
    with fake_server(engine) as server:
        url = urlsplit(server.url)
        first = threading.Thread(target=lambda: ask(server, "I go first", max_tokens=40))
        first.start()
        wait_for(lambda: Store().turns("default"))  # the first turn holds the model
        body = b'{"messages": [{"role": "user", "content": "I will not wait"}]}'
        with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            time.sleep(0.3)  # queued behind the first turn, then gone
        first.join(30)
        ask(server, "I come last", max_tokens=3)
    users = [text for role, text in log() if role == "user"]
    assert users == ["I go first", "I come last"]
    assert len(engine.calls) == 2


def test_other_web_sites_are_kept_out():
    """A page on another site can make the person's browser send requests here (a text/plain
    POST needs no permission), or rebind its own host name to 127.0.0.1 and read answers."""
    with fake_server() as server:
        facts = "/v1/memory/facts"
        fact = {"text": "I keep bees"}
        plain = {"Content-Type": "text/plain"}
        assert_error(request(server, "POST", facts, json.dumps(fact).encode(), plain), 415)
        evil = {"Origin": "http://evil.example"}
        assert_error(request(server, "POST", facts, fact, evil), 403, "forbidden_origin")
        port = urlsplit(server.url).port
        rebound = {"Host": f"evil.example:{port}"}
        assert_error(request(server, "GET", facts, None, rebound), 403, "forbidden_host")
        assert Store().facts() == []
        same_site = {"Origin": server.url, "Host": urlsplit(server.url).netloc}
        assert request(server, "POST", facts, fact, same_site)[0] == 201
        assert [f.text for f in Store().facts()] == ["I keep bees"]


def test_a_body_nobody_reads_is_not_taken_for_the_next_request():
    with fake_server() as server:
        url = urlsplit(server.url)
        hidden = f"GET /v1/memory/facts HTTP/1.1\r\nHost: {url.netloc}\r\n\r\n".encode()
        with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
            sock.sendall(
                f"GET /v1/models HTTP/1.1\r\nHost: {url.netloc}\r\n"
                f"Content-Length: {len(hidden)}\r\n\r\n".encode()
                + hidden
            )
            answer = b""
            while part := sock.recv(4096):
                answer += part
        assert answer.count(b"HTTP/1.1 ") == 1 and answer.startswith(b"HTTP/1.1 200")


def post_chat(server, text, stream=False):
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "stream": stream}
    return request(server, "POST", "/v1/chat/completions", body)


@pytest.mark.parametrize("stream", [False, True])
def test_an_overloaded_server_logs_one_line_per_refusal_not_a_traceback(capsys, stream):
    with fake_server() as server:
        server.app.service.worker.max_waiting = 0  # every request finds the queue full
        for _ in range(3):
            result = post_chat(server, "hello", stream)
            if not stream:
                assert_error(result, 503, "overloaded")
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "overloaded" in line]
    assert len(lines) == 3 and all(line.startswith("mlxmem serve: 503") for line in lines)


def test_an_unexpected_failure_still_logs_its_traceback(capsys):
    def broken(prompt):
        raise ZeroDivisionError("a bug")

    with fake_server(FakeEngine(broken)) as server:
        assert_error(post_chat(server, "hello"), 500)
    assert "ZeroDivisionError: a bug" in capsys.readouterr().err


def test_a_deletion_drops_the_fact_extractors_slot_even_for_a_new_conversation():
    engine = FakeEngine()
    long = "My neighbour's name is Berta and she keeps three goats on the roof of her house."
    with fake_server(engine, extract_facts=True) as server:
        ask(server, long, user="a")
        assert "facts" in engine.slots  # the extractor read the message
        Store().delete_conversation("a")  # as `mlxmem history rm -c a --all` would
        ask(server, "hello", user="b")  # a Companion made after the deletion
        assert "facts" not in engine.slots


def test_a_conversation_is_kept_out_of_recall_through_the_api():
    with fake_server(FakeEngine()) as server:
        ask(server, "My greenhouse in Tromso grows purple kohlrabi.", user="garden")
        path = "/v1/memory/conversations/garden"
        status, conversation, _ = request(server, "PATCH", path, {"private": True})
        assert status == 200 and conversation["private"] is True
        listed = request(server, "GET", "/v1/memory/conversations")[1]["data"]
        assert [c["private"] for c in listed if c["name"] == "garden"] == [True]
        context = (
            "/v1/memory/context?conversation=today&draft=What%20grows%20in%20my%20greenhouse%3F"
        )
        assert request(server, "GET", context)[1]["recalled"] == []
        request(server, "PATCH", path, {"private": False})
        assert request(server, "GET", context)[1]["recalled"] != []
        assert_error(request(server, "PATCH", path, {"private": "yes"}), 400, "invalid_value")
        assert (
            request(server, "PATCH", "/v1/memory/conversations/nope", {"private": True})[0] == 404
        )


def test_serve_overhead_benchmark_sets_the_held_server_beside_the_held_chat(tmp_path):
    script = Path(__file__).parent.parent / "benchmarks" / "serve_overhead.py"
    env = {**os.environ, "MLXMEM_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(script), "--turns", "3", "--warmup", "1", "--json"],
        capture_output=True, text=True, check=True, env=env, timeout=300,
    )  # fmt: skip
    result = json.loads(done.stdout)
    first = result["first_text_ms"]
    assert set(first) == {"direct_held", "direct", "http_stream"} and min(first.values()) > 0
    # holding is the point: a held store skips the open each unheld turn pays (about 30 ms)
    assert first["direct_held"] < first["direct"]
    assert result["serve_vs_held_ratio"] > 0


def test_a_wrong_type_is_named_as_json_names_it():
    from mlxmem.serve.schema import ApiError, conversation_of, parse_chat_request

    said = {"messages": [{"role": "user", "content": "x"}]}
    for extra, message in [
        ({"seed": "7"}, "seed must be a whole number, not a string"),
        ({"stream": 1}, "stream must be true or false, not a whole number"),
        ({"n": {}}, "n must be a whole number, not an object"),
    ]:
        with pytest.raises(ApiError, match=message):
            parse_chat_request(said | extra, MODEL, "default")
    with pytest.raises(ApiError, match="user must be a string, not a list"):
        conversation_of(said | {"user": ["a"]}, None, "default")


def test_a_request_cut_off_by_the_deadline_is_not_executed(monkeypatch):
    """The request line and some headers arrive, the blank line that ends the headers never
    does: the request has not arrived whole, so nothing may be done for it."""
    monkeypatch.setattr(RequestHandler, "request_deadline", 1.0)
    with fake_server() as server:
        fact = request(server, "POST", "/v1/memory/facts", {"text": "I keep bees"})[1]
        url = urlsplit(server.url)
        with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
            sock.sendall(
                f"DELETE /v1/memory/facts/{fact['id']} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                "X-Still-Typing: a".encode()
            )
            time.sleep(2.0)  # past the deadline, the headers still not ended
        time.sleep(0.5)
        assert [f.text for f in Store().facts()] == ["I keep bees"]


def test_the_deadline_does_not_fire_while_a_whole_request_is_answered(monkeypatch):
    """A DELETE/GET with a small body the endpoint never reads (some clients always send
    '{}'): the request is all here, but the watchdog keeps running during the answer."""
    monkeypatch.setattr(RequestHandler, "request_deadline", 1.0)
    engine = FakeEngine(lambda prompt: " ".join(["word"] * 60), delay_s=0.04)
    with fake_server(engine) as server:
        busy = threading.Thread(
            target=request,
            args=(
                server,
                "POST",
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hold the model"}]},
            ),
        )
        busy.start()
        time.sleep(0.3)  # the model is busy for ~2.5 s
        status, body, _ = request(
            server, "GET", "/v1/memory/context", b"{}", {"Content-Type": "application/json"}
        )
        busy.join(30)
    assert status == 200 and body["object"] == "mlxmem.context", (status, body)
