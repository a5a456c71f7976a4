"""Room-join tokens (LiveKit access tokens, HS256 JWTs) minted from the server's key pair."""

from __future__ import annotations

import datetime

from livekit import api


def participant_token(key: str, secret: str, room: str, identity: str, ttl_s: float | None = None,
                      agent_dispatch: str | None = None, agent: bool = False) -> str:
    """A token to join ``room`` as ``identity``, publishing, subscribing and sending data.

    Args:
        key, secret: the LiveKit server's API key pair.
        ttl_s: lifetime in seconds (None: the SDK's default, 6 h).
        agent_dispatch: also dispatch this agent name when the join creates the room
            (``RoomConfiguration.agents``).
        agent: join as an agent participant (``kind`` agent: Myna itself, never counted as
            someone to speak to).
    """
    token = (api.AccessToken(key, secret).with_identity(identity).with_name(identity)
             .with_grants(api.VideoGrants(room_join=True, room=room, can_publish=True, can_subscribe=True,
                                          can_publish_data=True, can_update_own_metadata=True)))
    if agent:
        token = token.with_kind("agent")
    if ttl_s is not None:
        token = token.with_ttl(datetime.timedelta(seconds=ttl_s))
    if agent_dispatch is not None:
        token = token.with_room_config(api.RoomConfiguration(agents=[api.RoomAgentDispatch(agent_name=agent_dispatch)]))
    return token.to_jwt()
