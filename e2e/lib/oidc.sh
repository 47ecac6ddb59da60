# The world's OAuth 2.0 token endpoint and JWKS (e2e/oidc/token-endpoint.py) on
# 127.0.0.1:$OIDC_PORT, for the brokers' OAUTHBEARER listener (kafka.sh, PORT+4). Sourced by
# world.sh after common.sh. One RSA key signs every token (RS256, $OIDC_TOKEN_LIFETIME s, short
# so tests see clients fetch new ones); the client `mirrorflow` has a random secret, both made
# once per world (MF_STATE), never in the repository. clients.json is read on every request, so
# a test may add a client to it.

OIDC_TOKEN_LIFETIME="${OIDC_TOKEN_LIFETIME:-60}"
OIDC_CLIENT_ID=mirrorflow
OIDC_AUDIENCE=kafka

oidc_dir() { echo "$MF_STATE/oidc"; }
oidc_url() { echo "http://127.0.0.1:$OIDC_PORT"; }
oidc_jwks_url() { echo "$(oidc_url)/jwks"; }

oidc_material() {
  local dir
  dir="$(oidc_dir)"
  [ -f "$dir/clients.json" ] && return 0
  mkdir -p "$dir"
  need openssl "openssl"
  openssl genrsa -out "$dir/signing-key.pem" 2048 >/dev/null 2>&1 || die "openssl could not make the token signing key"
  openssl rand -hex 16 | tr -d '\n' >"$dir/client-secret"
  chmod 600 "$dir/signing-key.pem" "$dir/client-secret"
  printf '{"%s": {"secret": "%s", "scopes": ["kafka"]}}\n' "$OIDC_CLIENT_ID" "$(cat "$dir/client-secret")" \
    >"$dir/clients.json.tmp"
  chmod 600 "$dir/clients.json.tmp"
  mv "$dir/clients.json.tmp" "$dir/clients.json"
}

oidc_serves() { curl -fsS --max-time 2 "$(oidc_url)/healthz" >/dev/null; }

oidc_start() {
  local dir
  dir="$(oidc_dir)"
  if pid_alive "$dir/token-endpoint.pid"; then return 0; fi
  need python3 "Python 3 (standard library only)"
  require_port_free "$OIDC_PORT" "OAuth token endpoint" OIDC_PORT
  oidc_material
  log "starting the OAuth token endpoint on $(oidc_url)"
  nohup python3 "$MF_ROOT/e2e/oidc/token-endpoint.py" --listen "127.0.0.1:$OIDC_PORT" \
    --key "$dir/signing-key.pem" --clients "$dir/clients.json" --lifetime "$OIDC_TOKEN_LIFETIME" \
    --issuer "$(oidc_url)" --audience "$OIDC_AUDIENCE" --log "$dir/tokens.log" \
    >>"$dir/token-endpoint.log" 2>&1 &
  echo $! >"$dir/token-endpoint.pid"
  wait_until 20 "the OAuth token endpoint to serve" oidc_serves ||
    die "the OAuth token endpoint did not come up (log: $dir/token-endpoint.log)"
}

oidc_stop() { stop_pidfile "$(oidc_dir)/token-endpoint.pid" 10; }
