"""Serve BYTES zero bytes to every HTTP/1.0 GET on ADDR:PORT (a benchmark test host).

Usage: bulk_server.py ADDR PORT BYTES. Prints `ready` once listening; one thread per client;
the body is written from one preallocated buffer so the server is never the bottleneck."""
import socket
import sys
import threading

addr, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
chunk = memoryview(bytes(1 << 20))


def serve(conn):
    with conn:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        left = size
        while left > 0:
            n = min(left, len(chunk))
            conn.sendall(chunk[:n])
            left -= n


s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, port))
s.listen(64)
print("ready", flush=True)
sys.stdout.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
