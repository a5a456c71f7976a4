"""Access tokens: LiveKit-style HS256 JWTs, minted by ``myna token``, checked per request.

With keys configured (``--api-key``/``--api-secret`` or ``MYNA_API_KEY``/``MYNA_API_SECRET``),
``POST/PATCH /api/offer`` and ``GET /v1/tts/stream`` need ``Authorization: Bearer <jwt>`` (the
WebSocket also takes ``?access_token=``). Tokens are LiveKit access tokens (``livekit-api``'s
``AccessToken`` and ``TokenVerifier``: ``iss`` = the API key, ``sub`` = the identity, ``exp``
required) that carry the inference grant (``"inference": {"perform": true}``): a LiveKit room
token signed with the same key is not a Myna token. Optional attributes restrict it:

- ``myna.engines``: comma-separated engines the token may use;
- ``myna.max_sessions``: sessions the identity may hold at once (tighter than the worker's cap).

Errors: no token → 401 ``token_required``; bad signature, wrong issuer, expired or malformed →
401 ``bad_token``; a valid token without the grant, or asking for an engine it may not use →
403 ``forbidden``.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import jwt
from livekit.api import AccessToken, InferenceGrants, TokenVerifier

from myna.errors import HTTPError

ENGINES_ATTRIBUTE = "myna.engines"
MAX_SESSIONS_ATTRIBUTE = "myna.max_sessions"


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
    """Checks tokens against one API key and secret (HS256; ``livekit-api``'s verifier)."""

    def __init__(self, api_key: str, api_secret: str):
        if not api_key or not api_secret:
            raise ValueError("an API key and secret are both needed")
        self._verifier = TokenVerifier(api_key, api_secret)

    def verify(self, token: str | None) -> Grant:
        """The grant of ``token``.

        Raises:
            AuthError: 401 ``token_required`` / ``bad_token``, 403 ``forbidden``.
        """
        if not token:
            raise AuthError(401, "token_required", "this worker needs an access token (Authorization: Bearer ...)")
        try:
            claims = self._verifier.verify(token)
        except jwt.ExpiredSignatureError:
            raise AuthError(401, "bad_token", "the access token has expired") from None
        except (jwt.InvalidTokenError, ValueError, TypeError):
            raise AuthError(401, "bad_token", "the access token is not valid for this worker") from None
        if not claims.identity:
            raise AuthError(401, "bad_token", "the access token has no identity (sub)")
        if claims.inference is None or not claims.inference.perform:
            raise AuthError(403, "forbidden", "the access token does not grant speech synthesis (inference.perform)")
        attributes = claims.attributes or {}
        engines = attributes.get(ENGINES_ATTRIBUTE)
        max_sessions = attributes.get(MAX_SESSIONS_ATTRIBUTE)
        try:
            max_sessions = int(max_sessions) if max_sessions is not None else None
        except ValueError:
            raise AuthError(401, "bad_token", f"the token's {MAX_SESSIONS_ATTRIBUTE} is not an integer") from None
        return Grant(
            identity=claims.identity,
            engines=frozenset(e.strip() for e in engines.split(",") if e.strip()) if engines is not None else None,
            max_sessions=max_sessions,
        )


def bearer_token(headers, query) -> str | None:
    """The token of a request: ``Authorization: Bearer …`` or, failing that, ``?access_token=``."""
    header = headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return query.get("access_token") or None
