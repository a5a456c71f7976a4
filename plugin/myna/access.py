"""The client side of access tokens: what a client of a worker with keys sends, and what it
tells the user when the worker refuses it.

A worker started with ``--api-key``/``--api-secret`` wants ``Authorization: Bearer TOKEN`` on
``POST/PATCH /api/offer`` and on ``GET /v1/tts/stream`` (:mod:`myna.server.auth`). Every remote
client (``myna say --server``, :class:`myna.rtc.client.MynaClient`, the framework plug-ins'
remote backend, ``examples/client.py``) gets its token from :class:`Credentials`:

1. a token given to it (``token=``, ``--token``);
2. else, with an API key and secret given to it (``api_key=``, ``api_secret=``), a fresh
   short-lived token minted for each connection by :func:`myna.server.auth.mint_token`, so a
   long-running agent never sends an expired one;
3. else ``MYNA_TOKEN`` from the environment;
4. else, with ``MYNA_API_KEY`` and ``MYNA_API_SECRET`` set, tokens minted from those (as in 2);
5. else no token (a worker without keys needs none).

A refusal (HTTP 401/403/431) becomes :class:`AccessRefused`, whose message names the fix.
"""

from __future__ import annotations

import datetime
import logging
import os
import uuid
import warnings

#: Environment variable a client reads its access token from.
TOKEN_ENV = "MYNA_TOKEN"
#: Environment variables of the API key pair (the same that ``myna serve`` and ``myna token`` read).
API_KEY_ENV, API_SECRET_ENV = "MYNA_API_KEY", "MYNA_API_SECRET"
#: Lifetime of a token minted from the key pair: one connection's handshake needs it.
MINTED_TTL = datetime.timedelta(minutes=10)

#: The HTTP status of each error code of a refused token (:mod:`myna.server.auth`).
ACCESS_STATUS = {"token_required": 401, "bad_token": 401, "token_expired": 401, "token_not_yet_valid": 401,
                 "forbidden": 403, "token_too_large": 431}
#: Header of a worker's refusal that names its error code (a refused WebSocket handshake has no
#: readable body).
ERROR_HEADER = "Myna-Error"

_PROBLEMS = {
    "token_required": "this worker needs an access token",
    "bad_token": "the worker refused the access token (signed with another key, or malformed)",
    "token_expired": "the access token has expired by the worker's clock",
    "token_not_yet_valid": "the access token is not valid yet by the worker's clock (the minter's clock runs ahead)",
    "token_too_large": "the access token is too large for the worker",
    "forbidden": "the access token does not allow this (no inference grant, or an engine outside its myna.engines)",
}
_FIXES = {
    "token_required": f"pass one (token=, --token) or set {TOKEN_ENV}; `myna token --identity NAME` mints one "
                      "with the worker's API key and secret",
    "bad_token": "mint a fresh one with `myna token` and the worker's own API key and secret",
    "token_expired": "mint a fresh one (`myna token`, or let the client mint one per connection from the key "
                     "pair); if a fresh one is refused too, the minter's clock runs behind the worker's: sync "
                     "both clocks (NTP)",
    "token_not_yet_valid": "a fresh token will fail the same way: sync the clock of the machine that mints tokens "
                           "with the worker's (NTP)",
    "token_too_large": "mint one with fewer attributes",
    "forbidden": "mint one that allows it with `myna token` (--engines)",
}


class AccessRefused(RuntimeError):
    """The worker refused this client's token (HTTP 401, 403 or 431).

    Attributes:
        status: the HTTP status (401, 403 or 431).
        code: a key of :data:`ACCESS_STATUS` (the worker's contract codes: ``token_required``,
            ``bad_token``, ``token_expired``, ``token_not_yet_valid``, ``forbidden``,
            ``token_too_large``); the advice follows it.
        message: what went wrong (the worker's words when it sent some) and how to fix it
            (also ``str(exc)``).
    """

    def __init__(self, status: int, code: str, detail: str = ""):
        self.status, self.code = status, code
        problem = detail or _PROBLEMS.get(code, f"the worker refused access (HTTP {status} {code})")
        self.message = f"{problem}: {_FIXES[code]}" if code in _FIXES else problem
        super().__init__(self.message)

    @classmethod
    def from_status(cls, status: int, token_sent: bool, headers=None) -> "AccessRefused":
        """The refusal of a request whose answer body could not be read (a WebSocket handshake):
        the code from its ``Myna-Error`` header (in ``headers``, a mapping), else from the status
        and whether a token was sent; the worker's time from its ``Date`` header."""
        code = (headers or {}).get(ERROR_HEADER)
        if code not in ACCESS_STATUS:
            code = "forbidden" if status == 403 else "bad_token" if token_sent else "token_required"
        detail = ""
        date = (headers or {}).get("Date")
        if date and code in ("token_expired", "token_not_yet_valid"):
            detail = f"{_PROBLEMS[code]} (the worker's clock reads {date})"
        return cls(status, code, detail)


class Credentials:
    """Where a client's access token comes from (see the module docstring for the order).

    Args:
        token: an access token, used as it is (less the whitespace around it: a line read from
            a file or an env file ends with one).
        api_key, api_secret: the worker's key pair, to mint tokens here (used with no ``token``).
        With neither, ``MYNA_TOKEN``, else ``MYNA_API_KEY`` and ``MYNA_API_SECRET``.
        identity: the identity of minted tokens (None: ``myna-client-`` and a random suffix, so
            separate clients do not share the worker's per-identity session cap).

    Raises:
        ValueError: the token holds spaces or control characters inside (no token does; it
            could not go in a header), naming where it came from.
    """

    def __init__(self, token: str | None = None, *, api_key: str | None = None, api_secret: str | None = None,
                 identity: str | None = None):
        given_keys = bool(api_key and api_secret)
        source = "the token given" if token else TOKEN_ENV
        self._token = _clean(token or (None if given_keys else os.environ.get(TOKEN_ENV)), source)
        key = api_key if given_keys else os.environ.get(API_KEY_ENV)
        secret = api_secret if given_keys else os.environ.get(API_SECRET_ENV)
        self._keys = (key, secret) if self._token is None and key and secret else None
        self.identity = identity or f"myna-client-{uuid.uuid4().hex[:8]}"

    def token(self) -> str | None:
        """The token for the next request or connection (None: send none)."""
        if self._keys is None:
            return self._token
        from myna.server.auth import mint_token

        return mint_token(*self._keys, self.identity, MINTED_TTL)

    def headers(self) -> dict[str, str]:
        """Request headers carrying the token (``Authorization: Bearer …``; empty without one)."""
        token = self.token()
        return {"Authorization": f"Bearer {token}"} if token else {}


def _clean(token: str | None, source: str) -> str | None:
    """``token`` without the whitespace around it (None when nothing is left)."""
    token = (token or "").strip()
    if any(c.isspace() or not c.isprintable() for c in token):
        raise ValueError(f"{source} is not an access token: it holds spaces or control characters; "
                         "mint one with `myna token`")
    return token or None


#: HS256 wants a key of at least the hash's length (RFC 7518 §3.2); PyJWT warns below it.
MIN_SECRET_BYTES = 32
_short_secrets: set[str] = set()


def short_secret_notice(secret: str | None, name: str) -> None:
    """Say once per process, in one log line, that ``secret`` (called ``name``: the variable or
    option it came from) is shorter than HS256 wants, and silence PyJWT's own warning for it.

    PyJWT prints two lines (``InsecureKeyLengthWarning`` and the line of code that signed) in
    every process that signs or checks a token with such a key: with LiveKit's development keys
    (``livekit-server --dev``: ``devkey`` / ``secret``) that is every ``myna room``, ``myna
    worker`` and ``myna talk``. Those keys are fine on a development server, so this says what it
    means once instead. Longer secrets change nothing.
    """
    size = len((secret or "").encode())
    if not secret or size >= MIN_SECRET_BYTES:
        return
    try:
        from jwt.warnings import InsecureKeyLengthWarning
    except ImportError:  # a PyJWT that does not warn
        pass
    else:
        warnings.filterwarnings("ignore", category=InsecureKeyLengthWarning)
    if name not in _short_secrets:
        _short_secrets.add(name)
        livekit = "LIVEKIT" in name
        logging.getLogger("myna").warning(
            "%s is %d bytes, under the %d that HS256 wants: fine for %s, too short for production (use a random "
            "secret of %d+ characters%s)", name, size, MIN_SECRET_BYTES,
            "a development server (livekit-server --dev: devkey / secret)" if livekit else "trying things out",
            MIN_SECRET_BYTES, ", e.g. from `livekit-server generate-keys`" if livekit else "")
