#!/usr/bin/env python3
"""The world's OAuth 2.0 token endpoint (client credentials grant) and JWKS, on loopback.

Issues RS256 JWTs that the brokers' OAUTHBEARER listener validates against /jwks. Python's
standard library serves HTTP; the openssl CLI signs (RSASSA-PKCS1-v1_5 with SHA-256, which is
what RS256 is), so nothing is installed and no crypto is written here.

  token-endpoint.py --listen 127.0.0.1:PORT --key key.pem --clients clients.json
      [--lifetime 60] [--issuer URL] [--audience kafka] [--log FILE]

clients.json: {"<client id>": {"secret": "...", "scopes": ["kafka", ...], "audience": "..."}}
(read on every request, so a test may add a client; "audience" overrides --audience, e.g. for
a client whose tokens the brokers must refuse). Endpoints:
  POST /token     grant_type=client_credentials, client credentials as HTTP Basic (RFC 6749
                  2.3.1) or as form fields; answers RFC 6749 5.1 / 5.2 JSON
  GET  /jwks      the public key (RFC 7517)
  GET  /issued    tokens issued so far per client id (tests count refreshes with it)
  GET  /healthz   200 once serving
Secrets are never logged: a log line names the client id, the scope and the expiry.
"""

import argparse
import base64
import hashlib
import json
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def public_jwk(key_path: str) -> dict:
    # `openssl rsa -modulus` prints "Modulus=<hex>"; the world makes keys with e = 65537.
    out = subprocess.run(
        ["openssl", "rsa", "-in", key_path, "-noout", "-modulus"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    n = bytes.fromhex(out.split("=", 1)[1])
    return {
        "kty": "RSA",
        "use": "sig",
        "alg": "RS256",
        "kid": hashlib.sha256(n).hexdigest()[:16],
        "n": b64url(n),
        "e": b64url((65537).to_bytes(3, "big")),
    }


class Issuer:
    def __init__(self, args):
        self.key = args.key
        self.clients_path = args.clients
        self.lifetime = args.lifetime
        self.issuer = args.issuer
        self.audience = args.audience
        self.jwk = public_jwk(args.key)
        self.issued = {}
        self.lock = threading.Lock()
        self.log = open(args.log, "a", buffering=1) if args.log else sys.stderr

    def clients(self) -> dict:
        with open(self.clients_path) as f:
            return json.load(f)

    def sign(self, claims: dict) -> str:
        header = {"alg": "RS256", "typ": "JWT", "kid": self.jwk["kid"]}
        signing_input = (
            b64url(json.dumps(header, separators=(",", ":")).encode())
            + "."
            + b64url(json.dumps(claims, separators=(",", ":")).encode())
        )
        signature = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", self.key],
            input=signing_input.encode(),
            check=True,
            capture_output=True,
        ).stdout
        return signing_input + "." + b64url(signature)

    def token(self, client_id: str, scopes: list, audience: str) -> dict:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": client_id,
            "aud": audience,
            "iat": now,
            "exp": now + self.lifetime,
            "jti": str(uuid.uuid4()),
            "scope": " ".join(scopes),
        }
        token = self.sign(claims)
        with self.lock:
            self.issued[client_id] = self.issued.get(client_id, 0) + 1
            count = self.issued[client_id]
        print(
            f"{time.strftime('%H:%M:%S')} issued token {count} to client '{client_id}' "
            f"scope '{claims['scope']}' expiring in {self.lifetime} s",
            file=self.log,
        )
        return {
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": self.lifetime,
            "scope": claims["scope"],
        }


def make_handler(issuer: Issuer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            # Request lines carry no secret, but the token log says all a test needs.
            pass

        def answer(self, status: int, body: dict, extra_headers=()):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            for name, value in extra_headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            path = urllib.parse.urlsplit(self.path).path
            if path == "/jwks":
                self.answer(200, {"keys": [issuer.jwk]})
            elif path == "/issued":
                with issuer.lock:
                    self.answer(200, dict(issuer.issued))
            elif path == "/healthz":
                self.answer(200, {"ok": True})
            else:
                self.answer(404, {"error": "not_found"})

        def do_POST(self):
            if urllib.parse.urlsplit(self.path).path != "/token":
                self.answer(404, {"error": "not_found"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > 64 * 1024:
                self.answer(413, {"error": "invalid_request"})
                return
            form = urllib.parse.parse_qs(self.rfile.read(length).decode("utf-8", "replace"))
            field = lambda name: (form.get(name) or [None])[0]
            client_id, secret = field("client_id"), field("client_secret")
            auth = self.headers.get("Authorization") or ""
            if auth.startswith("Basic "):
                try:
                    decoded = base64.b64decode(auth[6:], validate=True).decode()
                    client_id, _, secret = decoded.partition(":")
                except ValueError:
                    client_id = None
            if field("grant_type") != "client_credentials":
                self.answer(400, {"error": "unsupported_grant_type"})
                return
            client = issuer.clients().get(client_id or "")
            if client is None or secret != client.get("secret"):
                self.answer(
                    401,
                    {"error": "invalid_client", "error_description": "unknown client or wrong secret"},
                    [("WWW-Authenticate", 'Basic realm="mirrorflow-world"')],
                )
                return
            allowed = client.get("scopes", [])
            asked = (field("scope") or "").split()
            if any(s not in allowed for s in asked):
                self.answer(400, {"error": "invalid_scope", "error_description": f"client may ask for {allowed}"})
                return
            audience = client.get("audience", issuer.audience)
            self.answer(200, issuer.token(client_id, asked or allowed, audience))

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", required=True, help="127.0.0.1:PORT")
    p.add_argument("--key", required=True, help="RSA private key (PEM) that signs the tokens")
    p.add_argument("--clients", required=True, help="JSON file of clients, secrets and scopes")
    p.add_argument("--lifetime", type=int, default=60, help="token lifetime in seconds")
    p.add_argument("--issuer", default="http://127.0.0.1")
    p.add_argument("--audience", default="kafka")
    p.add_argument("--log")
    args = p.parse_args()
    host, _, port = args.listen.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "[::1]"):
        sys.exit("token-endpoint: listens on loopback only")
    server = ThreadingHTTPServer((host.strip("[]"), int(port)), make_handler(Issuer(args)))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
