"""A webhook endpoint over TLS (Python's standard library only): the https target
of the dispatcher tests. Prints the port it listens on, then one JSON line per
request received: {"path", "headers", "body_hex"}; answers 200.

    python3 https_webhook.py <cert.pem> <key.pem>
"""
import http.server
import json
import ssl
import sys


class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        print(json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                          "body_hex": body.hex()}), flush=True)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"ok": true}')

    def log_message(self, *args):  # keep stdout for the request lines
        pass


def main(cert, key):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:3])
