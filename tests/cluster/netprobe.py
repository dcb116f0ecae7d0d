#!/usr/bin/env python3
"""Tiny network probes run inside emulated hosts (standard library only).

  netprobe.py tcp-server                 # prints "LISTENING <port>", serves
  netprobe.py tcp-client ADDR PORT [--bytes N] [--timeout S]
  netprobe.py udp-server                 # prints "LISTENING <port>", then
                                         # "GOT <payload>" per datagram
  netprobe.py udp-send ADDR PORT PAYLOAD [--count N]

The TCP server reads a connection to its end and answers "OK <bytes read>";
the client sends N bytes, half-closes, checks the answer and prints one JSON
line {"ok": ..., "bytes": ..., "seconds": ..., "error": ...}; it exits 0 on
success, 1 on failure (connect refused, timed out, wrong answer). Servers bind
port 0 and print the port the kernel chose.
"""

import argparse
import json
import socket
import sys
import threading
import time


def tcp_server(_args):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", 0))
    sock.listen(64)
    print(f"LISTENING {sock.getsockname()[1]}", flush=True)

    def serve(conn):
        with conn:
            conn.settimeout(120)
            total = 0
            try:
                while True:
                    chunk = conn.recv(1 << 16)
                    if not chunk:
                        break
                    total += len(chunk)
                conn.sendall(f"OK {total}\n".encode())
            except OSError as e:
                print(f"connection failed after {total} bytes: {e}", flush=True)

    while True:
        conn, _ = sock.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def tcp_client(args):
    result = {"ok": False, "bytes": args.bytes}
    start = time.monotonic()
    try:
        with socket.create_connection((args.addr, args.port),
                                      timeout=args.timeout) as conn:
            payload = b"x" * min(args.bytes, 1 << 20)
            left = args.bytes
            while left:
                n = min(left, len(payload))
                conn.sendall(payload[:n])
                left -= n
            conn.shutdown(socket.SHUT_WR)
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = conn.recv(64)
                if not chunk:
                    break
                answer += chunk
        if answer.decode().strip() != f"OK {args.bytes}":
            raise OSError(f"unexpected answer {answer!r}")
        result["ok"] = True
    except OSError as e:  # socket.timeout is an OSError
        result["error"] = f"{type(e).__name__}: {e}"
    result["seconds"] = round(time.monotonic() - start, 4)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


def udp_server(_args):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", 0))
    print(f"LISTENING {sock.getsockname()[1]}", flush=True)
    while True:
        data, _ = sock.recvfrom(2048)
        print(f"GOT {data.decode(errors='replace')}", flush=True)


def udp_send(args):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    errors = 0
    for _ in range(args.count):
        try:
            sock.sendto(args.payload.encode(), (args.addr, args.port))
        except OSError as e:
            errors += 1
            print(f"send failed: {e}", flush=True)
        time.sleep(0.02)
    print(json.dumps({"sent": args.count - errors, "errors": errors}), flush=True)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("tcp-server").set_defaults(fn=tcp_server)
    client = sub.add_parser("tcp-client")
    client.add_argument("addr")
    client.add_argument("port", type=int)
    client.add_argument("--bytes", type=int, default=4)
    client.add_argument("--timeout", type=float, default=2.0)
    client.set_defaults(fn=tcp_client)
    sub.add_parser("udp-server").set_defaults(fn=udp_server)
    send = sub.add_parser("udp-send")
    send.add_argument("addr")
    send.add_argument("port", type=int)
    send.add_argument("payload")
    send.add_argument("--count", type=int, default=3)
    send.set_defaults(fn=udp_send)
    args = parser.parse_args()
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
