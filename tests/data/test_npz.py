"""`unstall.data.npz`: the index tables' headers are never parsed by two threads at once
(CPython 3.11's AST constructor shares one recursion counter between threads: a download
thread of the S3 helper failed with "AST constructor recursion depth mismatch")."""

from __future__ import annotations

import ast
import io
import threading
import time

import numpy as np

from unstall.data.npz import read_npz


def test_threads_parse_headers_one_at_a_time_and_read_every_array(monkeypatch):
    buf = io.BytesIO()
    np.savez(buf, meta=np.array(["1", "k"]), spans=np.arange(6).reshape(2, 3))
    data = buf.getvalue()
    inside, most, lock = [0], [0], threading.Lock()
    real = ast.literal_eval

    def slow_parse(text):  # holds the parse open long enough for another thread to enter
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.002)
        try:
            return real(text)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(ast, "literal_eval", slow_parse)
    results: list[dict] = []

    def reader() -> None:
        for _ in range(10):
            results.append(read_npz(data))

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 40 and most[0] == 1
    for r in results:
        assert r["meta"].tolist() == ["1", "k"] and r["spans"].tolist() == [[0, 1, 2], [3, 4, 5]]
