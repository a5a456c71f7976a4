"""Access tokens: LiveKit-style HS256 JWTs, minted by ``myna token``, checked per request.

With keys configured (``--api-key``/``--api-secret`` or ``MYNA_API_KEY``/``MYNA_API_SECRET``),
``POST/PATCH /api/offer`` and ``GET /v1/tts/stream`` need ``Authorization: Bearer <jwt>`` (the
WebSocket also takes ``?access_token=``). Tokens are LiveKit access tokens (``livekit-api``'s
``AccessToken`` layout, checked here with PyJWT: ``iss`` = the API key, ``sub`` = the identity, ``exp``
required) that carry the inference grant (``"inference": {"perform": true}``): a LiveKit room
token signed with the same key is not a Myna token. Optional attributes restrict it:

- ``myna.engines``: comma-separated engines the token may use;
- ``myna.max_sessions``: sessions the identity may hold at once (tighter than the worker's cap).

Errors: no token → 401 ``token_required``; bad signature, wrong issuer or malformed (a claim of
the wrong type: ``inference`` as a string, ``attributes`` as a list, ``myna.engines`` as a number
…) → 401 ``bad_token``; expired or not valid yet beyond :data:`CLOCK_SKEW_S` of clock skew →
401 ``token_expired`` / ``token_not_yet_valid``, naming the worker's time; over
:data:`MAX_TOKEN_BYTES` → 431 ``token_too_large``; a valid token without the grant, or asking
for an engine it may not use → 403 ``forbidden``.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import jwt
from livekit.api import AccessToken, InferenceGrants

from myna.errors import HTTPError

ENGINES_ATTRIBUTE = "myna.engines"
MAX_SESSIONS_ATTRIBUTE = "myna.max_sessions"
#: Seconds of clock difference tolerated between the machine that mints a token and the worker
#: (5 minutes, Kerberos' default): a token is accepted from ``nbf``/``iat`` minus this until
#: ``exp`` plus this.
CLOCK_SKEW_S = 300.0
#: Largest access token taken (bytes, 32 KiB: hundreds of attributes); over it 431
#: ``token_too_large``. The HTTP parser takes header lines up to
#: :data:`myna.server.app.MAX_HEADER_BYTES`, so such a token is refused in the contract's JSON.
MAX_TOKEN_BYTES = 32 * 1024
#: The grant claims a LiveKit token may carry; each must be a JSON object when present.
_GRANT_CLAIMS = ("video", "sip", "inference", "observability")


class AuthError(HTTPError):
    """A refused request: HTTP ``status`` (401 or 403) and contract ``code``."""


@dataclass(frozen=True)
class Grant:
    """What a verified token allows.

    Attributes:
        identity: the session owner (the token's ``sub``).
        engines: engines it may use (None: any).
        max_sessions: sessions it may hold at once (None: the worker's per-client cap).
    """

    identity: str
    engines: frozenset[str] | None = None
    max_sessions: int | None = None

    def check_engine(self, engine: str) -> None:
        """Raises :class:`AuthError` 403 when the token may not use ``engine``."""
        if self.engines is not None and engine not in self.engines:
            raise AuthError(403, "forbidden", f"this token may not use engine {engine!r}")


def mint_token(api_key: str, api_secret: str, identity: str, ttl: datetime.timedelta,
               engines: list[str] | None = None, max_sessions: int | None = None) -> str:
    """A signed token for ``identity``, valid for ``ttl`` (HS256 JWT, LiveKit format).

    Raises:
        ValueError: empty key, secret or identity.
    """
    if not identity:
        raise ValueError("a token needs an identity")
    attributes = {}
    if engines:
        attributes[ENGINES_ATTRIBUTE] = ",".join(engines)
    if max_sessions is not None:
        attributes[MAX_SESSIONS_ATTRIBUTE] = str(max_sessions)
    token = (AccessToken(api_key, api_secret).with_identity(identity).with_ttl(ttl)
             .with_inference_grants(InferenceGrants(perform=True)))
    if attributes:
        token = token.with_attributes(attributes)
    return token.to_jwt()


class Authenticator:
    """Checks tokens against one API key and secret (HS256, LiveKit's claim layout).

    Args:
        api_key, api_secret: the worker's key pair (the token's ``iss`` and signing key).
        clock_skew: seconds of clock difference tolerated between the minter and the worker
            (:data:`CLOCK_SKEW_S`), applied to ``nbf``, ``iat`` and ``exp``.
        clock: wall clock in seconds since the epoch (the worker's time named in refusals).

    Raises:
        ValueError: an empty key or secret.
    """

    def __init__(self, api_key: str, api_secret: str, *, clock_skew: float = CLOCK_SKEW_S,
                 clock: Callable[[], float] = time.time):
        if not api_key or not api_secret:
            raise ValueError("an API key and secret are both needed")
        self._key, self._secret = api_key, api_secret
        self.clock_skew = clock_skew
        self._clock = clock

    def verify(self, token: str | None) -> Grant:
        """The grant of ``token``.

        Every claim is checked for its type here, in one place: a correctly signed token whose
        claims have the wrong shape is refused (401 ``bad_token`` naming the claim), never an
        internal error.

        Raises:
            AuthError: 401 ``token_required`` / ``bad_token`` / ``token_expired`` /
                ``token_not_yet_valid``, 403 ``forbidden``; 431 ``token_too_large`` over
                :data:`MAX_TOKEN_BYTES`.
        """
        if not token:
            raise AuthError(401, "token_required", "this worker needs an access token (Authorization: Bearer ...)")
        if len(token) > MAX_TOKEN_BYTES:
            raise token_too_large(len(token))
        claims = self._decode(token)
        identity = claims.get("sub")
        if not isinstance(identity, str) or not identity:
            raise AuthError(401, "bad_token", "the access token has no identity (sub must be a non-empty string)")
        for name in _GRANT_CLAIMS:
            if claims.get(name) is not None and not isinstance(claims[name], dict):
                raise _malformed(name, "an object")
        inference = claims.get("inference")
        if inference is None:
            raise AuthError(403, "forbidden", "the access token does not grant speech synthesis (inference.perform)")
        perform = inference.get("perform", False)
        if not isinstance(perform, bool):
            raise _malformed("inference.perform", "true or false")
        if not perform:
            raise AuthError(403, "forbidden", "the access token does not grant speech synthesis (inference.perform)")
        attributes = claims.get("attributes")
        if attributes is None:
            attributes = {}
        if not isinstance(attributes, dict) or not all(isinstance(v, str) for v in attributes.values()):
            raise _malformed("attributes", "an object of strings")
        engines = attributes.get(ENGINES_ATTRIBUTE)
        max_sessions = attributes.get(MAX_SESSIONS_ATTRIBUTE)
        if max_sessions is not None:
            if not max_sessions.strip().isdigit() or int(max_sessions) < 1:
                raise _malformed(f"attributes.{MAX_SESSIONS_ATTRIBUTE}", "a whole number of at least 1, as a string")
            max_sessions = int(max_sessions)
        return Grant(
            identity=identity,
            engines=frozenset(e.strip() for e in engines.split(",") if e.strip()) if engines is not None else None,
            max_sessions=max_sessions,
        )

    def _decode(self, token: str) -> dict:
        """The signed claims of ``token`` (signature, issuer and times checked, with the skew).

        Raises:
            AuthError: 401 ``bad_token``, ``token_expired`` or ``token_not_yet_valid``.
        """
        now = self._clock()
        try:
            # Times are checked here rather than by PyJWT, against the injected clock, so a
            # refusal can name the worker's time and how far off the token is.
            claims = jwt.decode(token, key=self._secret, issuer=self._key, algorithms=["HS256"],
                                options={"require": ["exp"], "verify_exp": False, "verify_nbf": False,
                                         "verify_iat": False})
        except jwt.MissingRequiredClaimError as exc:
            raise AuthError(401, "bad_token", f"the access token has no {exc.claim} claim") from None
        except jwt.InvalidIssuerError:
            raise AuthError(401, "bad_token", "the access token was issued for another API key (iss)") from None
        except jwt.InvalidSignatureError:
            raise AuthError(401, "bad_token", "the access token is signed with another secret") from None
        except (jwt.InvalidTokenError, ValueError, TypeError):
            raise AuthError(401, "bad_token", "the access token is malformed (not an HS256 JWT of this worker)") from None
        for name in ("exp", "nbf", "iat"):
            value = claims.get(name)
            if (value is not None or name == "exp") and (isinstance(value, bool) or not isinstance(value, (int, float))
                                                         or not math.isfinite(value)):
                raise _malformed(name, "a number of seconds since the epoch")
        expires, starts = claims["exp"], max(claims.get("nbf") or 0, claims.get("iat") or 0)
        if now > expires + self.clock_skew:
            raise AuthError(401, "token_expired",
                            f"the access token expired at {_utc(expires)}; the worker's clock reads {_utc(now)} "
                            f"({now - expires:.0f} s later, beyond the {self.clock_skew:g} s of clock skew tolerated)")
        if starts > now + self.clock_skew:
            raise AuthError(401, "token_not_yet_valid",
                            f"the access token is not valid yet: it starts at {_utc(starts)}, the worker's clock reads "
                            f"{_utc(now)} ({starts - now:.0f} s earlier, beyond the {self.clock_skew:g} s of clock skew "
                            "tolerated): the clock of the machine that minted it runs ahead")
        return claims


def token_too_large(size: int) -> AuthError:
    """The 431 refusal of a token (or a request header holding one) of ``size`` bytes."""
    return AuthError(431, "token_too_large",
                     f"the access token is {size} bytes; this worker takes tokens of at most {MAX_TOKEN_BYTES} bytes")


def _malformed(claim: str, expected: str) -> AuthError:
    return AuthError(401, "bad_token", f"the access token's {claim} claim is malformed: it must be {expected}")


def _utc(seconds: float) -> str:
    """``seconds`` since the epoch as ISO 8601 UTC, to the second."""
    try:
        return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{seconds:.0f} s since the epoch"


def bearer_token(headers, query) -> str | None:
    """The token of a request: ``Authorization: Bearer …`` or, failing that, ``?access_token=``."""
    header = headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return query.get("access_token") or None
