"""Myna as a participant of LiveKit rooms: another transport for the same sessions.

- :mod:`myna.room.agent`: one room (text streams, data packets, RPC in; events, captions and
  one audio track out), a door to the one :class:`myna.session.Session` core.
- :mod:`myna.room.routing`: many participants' turns through the room's one session.
- :mod:`myna.room.audio`: the session's playout feeding the SDK's audio source.
- :mod:`myna.room.worker`: ``myna worker``, livekit-agents' dispatch with our own job entry point.
- :mod:`myna.room.bridge`: one loaded engine shared by rooms on other event loops.
- :mod:`myna.room.tokens`: room-join tokens.
- :mod:`myna.room.client`: a Python participant that speaks through Myna in a room (``myna talk``,
  the tests, the benchmarks).
- :mod:`myna.room.cli`: ``myna room``, ``myna worker`` and ``myna talk``.

Tooling lives in :mod:`myna.bench`: ``livekit-server`` and Redis on this host (``livekit_server``),
the room benchmark (``room``).

Not to be confused with :mod:`myna.integrations.livekit`, Myna as the TTS stage of a LiveKit
Agents ``AgentSession``.
"""
