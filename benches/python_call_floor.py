"""The Python side's own work per bridge call, as a floor for the `command hello` rows.

What the bridge worker does for each call, without the socket and without a thread:
parse the call line, look up and call the command, encode the answer line. Then a
SimpleQueue ping-pong between two threads, the most a thread hand-off could cost. Run it
on the server's CPU as scripts/bench does (docs/benchmarks.md, "Python bridge"):

    taskset -c 0 python3 benches/python_call_floor.py
"""

import json
import queue
import threading
import time


def hello(name="World"):
    return f"Hello, {name}!"


REGISTRY = {"hello": hello}
LINE = b'{"id":17,"op":"command","name":"hello","args":{"name":"Ada"}}\n'


def per_call(n=200_000):
    start = time.perf_counter()
    for _ in range(n):
        message = json.loads(LINE)
        function = REGISTRY[message["name"]]
        body = json.dumps({"result": function(**message.get("args", {}))}, default=str, allow_nan=False)
        ('{"id":%d,"status":%d,"body":%s}\n' % (message["id"], 200, body)).encode()
    return (time.perf_counter() - start) / n * 1e6


def hand_off_round_trip(n=20_000):
    there, back = queue.SimpleQueue(), queue.SimpleQueue()

    def echo():
        while (item := there.get()) is not None:
            back.put(item)

    thread = threading.Thread(target=echo)
    thread.start()
    start = time.perf_counter()
    for i in range(n):
        there.put(i)
        back.get()
    elapsed = time.perf_counter() - start
    there.put(None)
    thread.join()
    return elapsed / n * 1e6


if __name__ == "__main__":
    print(f"parse + call + encode: {per_call():.2f} us per call")
    print(f"thread hand-off, round trip: {hand_off_round_trip():.2f} us")
