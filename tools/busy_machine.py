"""Make this machine busy the way other jobs do, beside the suite, the demo or `dev up` (issue 50,
fault 19): every core spinning, outgoing connections churning through the ephemeral range, and
(with --squat) ports anywhere from 10000 up bound for a moment by a process that reserves
nothing, as other programs' servers are. Runs until interrupted or --seconds pass; prints what it
did each 10 s.

    python tools/busy_machine.py --seconds 900 --squat &   # then, beside it: make test

Stop it by its process id (it ends its children itself; its reaper ends them if it is killed:
relay.dev.processes.spawn).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import sys
import threading
import time

from relay.dev.processes import spawn

# A spinner: a child process keeping one core busy for SECONDS (its argument).
_SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass"


def _churn(port: int, until: float, pause: float, counts: list[int], slot: int) -> None:
    """Connect and close in a loop (`pause` seconds apart): each connection takes a local port
    from the ephemeral range and leaves it in TIME_WAIT."""
    while time.monotonic() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                counts[slot] += 1
        except OSError:
            time.sleep(0.01)
        time.sleep(pause)


def _accept(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        conn.close()


def _squat(until: float, counts: list[int], slot: int) -> None:
    """Listen on a random port from 10000 up for a moment, again and again."""
    while time.monotonic() < until:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", random.randint(10000, 65535)))
                s.listen()
            except OSError:
                continue
            counts[slot] += 1
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--spinners", type=int, default=os.cpu_count() or 2, help="busy processes (one per core)")
    parser.add_argument("--churners", type=int, default=4, help="threads opening and closing connections")
    parser.add_argument("--rate", type=float, default=500, help="connections per second, all churners together")
    parser.add_argument("--squat", action="store_true", help="also bind random ports from 10000 up for a moment")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # SIGTERM ends the spinners too (finally)
    until = time.monotonic() + args.seconds
    spinners = [spawn([sys.executable, "-c", _SPIN, str(args.seconds)]) for _ in range(args.spinners)]
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1024)
    threading.Thread(target=_accept, args=(server,), daemon=True).start()
    counts = [0] * (args.churners + 1)
    pause = args.churners / args.rate if args.rate > 0 else 0.0
    workers = [
        threading.Thread(target=_churn, args=(server.getsockname()[1], until, pause, counts, i), daemon=True)
        for i in range(args.churners)
    ]
    if args.squat:
        workers.append(threading.Thread(target=_squat, args=(until, counts, args.churners), daemon=True))
    for worker in workers:
        worker.start()
    try:
        while time.monotonic() < until:
            time.sleep(min(10.0, max(0.0, until - time.monotonic())))
            print(
                f"busy: {args.spinners} cores spinning, {sum(counts[:-1])} connections, {counts[-1]} ports squatted",
                flush=True,
            )
    except KeyboardInterrupt:
        pass
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.wait()
        server.close()


if __name__ == "__main__":
    main()
