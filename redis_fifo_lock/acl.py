"""The Redis ACL rules the lock needs, and how to read Redis's ACL refusals.

``acl_rules()`` is the one place the lock's least-privilege rule set is
written down; the docs quote it (docs/security.md) and the tests run the lock as a user
holding exactly these rules. Redis checks a script's commands, keys and
channels against the user's ACL one by one as the script runs, so the rules
list every command the Lua scripts call, besides those the client sends.

``refusal()`` turns the text of a refusal into a sentence naming the rule to
add: Redis 7.2+ and Valkey name the refused command, also inside a script;
Redis 6.2 and 7.0 do not say which command a script was refused, so the
sentence then lists the script's commands.
"""

from __future__ import annotations

import re

from .protocol import KEY_PREFIX

CLIENT_COMMANDS = ("evalsha", "eval")
"""Commands the client sends to run the scripts (EVAL when the server does not
know a script yet, after a restart or SCRIPT FLUSH)."""

SCRIPT_COMMANDS = (
    "time",
    "exists",
    "del",
    "pttl",
    "pexpire",
    "hget",
    "hmget",
    "hset",
    "hdel",
    "zadd",
    "zcard",
    "zrange",
    "zrangebylex",
    "zrem",
    "zremrangebyscore",
    "zscore",
    "publish",
)
"""Commands the Lua scripts call (``PUBLISH`` rings the doorbell)."""

DOORBELL_COMMANDS = ("subscribe", "unsubscribe")
"""Commands of the doorbell's pub/sub connection."""

_GLOB = re.compile(r"([*?\[\]\\])")


def key_pattern(namespace: str = "") -> str:
    """The glob pattern (str) of every key and doorbell channel of the locks in
    ``namespace``: ``fifolock:*``, or ``<namespace>:fifolock:*`` with glob
    characters of the namespace escaped, so that they match only themselves."""
    if not namespace:
        return f"{KEY_PREFIX}:*"
    escaped = _GLOB.sub(r"\\\1", namespace)
    return f"{escaped}:{KEY_PREFIX}:*"


def acl_rules(
    namespace: str = "",
    *,
    replicas: bool = False,
    database: bool = False,
    config: bool = False,
) -> list[str]:
    """The ACL rules (``ACL SETUSER`` arguments, list of str) a user of the lock needs.

    Give them to a user that has nothing else, e.g.
    ``ACL SETUSER fifolock reset resetchannels on ><password> <rules...>``
    (``resetchannels``: Redis 6.2 starts users with every channel allowed), or
    add them to the rules of a user shared with other work.

    Args:
        namespace: the locks' namespace (str, "" for none): their keys and
            channels are ``<namespace>:fifolock:*``. A Django cache's locks use
            its ``KEY_PREFIX``, Celery's ``fifo_lock_namespace``.
        replicas: add ``+wait``, for locks with ``replicas`` > 0.
        database: add ``+select``, for a database other than 0.
        config: add ``+config|get``, so the lock can check that the server never
            evicts its keys (it warns once per server that it could not, otherwise).

    Returns:
        ``+<command>`` for every command the lock sends, the scripts' included,
        then ``~<pattern>`` (keys) and ``&<pattern>`` (doorbell channels), then
        the optional ones asked for, in the order of the arguments.
    """
    commands = (*CLIENT_COMMANDS, *SCRIPT_COMMANDS, *DOORBELL_COMMANDS)
    pattern = key_pattern(namespace)
    rules = [f"+{command}" for command in commands] + [f"~{pattern}", f"&{pattern}"]
    for wanted, rule in ((replicas, "+wait"), (database, "+select"), (config, "+config|get")):
        if wanted:
            rules.append(rule)
    return rules


_NAMED_COMMAND = re.compile(r"no permissions to run the '([^']+)' command", re.IGNORECASE)
_SCRIPT_COMMAND = "can't run this command or subcommand"
_KEY = re.compile(r"access (?:one of the keys|at least one of the keys|a key)", re.IGNORECASE)
_CHANNEL = re.compile(r"(?:access (?:one of the channels|a channel)|publish to the channel)")


def refusal(message: str, namespace: str = "", commands: tuple[str, ...] = ()) -> str | None:
    """What Redis's ACL refused and the rule to add, from the text of its error;
    None if ``message`` is not an ACL refusal.

    Args:
        message: the error's text (redis-py drops the ``NOPERM`` prefix).
        namespace: the lock's namespace (str), for the key and channel pattern.
        commands: the commands (lower case) of the script that was refused, named
            when the server does not say which one it refused (Redis 6.2, 7.0).
    """
    named = _NAMED_COMMAND.search(message)
    if named:
        command = named.group(1).lower()
        return f"the user may not run the {command!r} command: add +{command}"
    if _SCRIPT_COMMAND in message:
        rules = " ".join(f"+{command}" for command in commands) or "the rules of acl_rules()"
        return (
            "the user may not run one of the commands the script calls (this server "
            f"does not say which; its ACL LOG does): add whichever it lacks of {rules}"
        )
    if _KEY.search(message):
        return f"the user may not access the lock's keys: add ~{key_pattern(namespace)}"
    if _CHANNEL.search(message):
        return f"the user may not use the lock's doorbell channels: add &{key_pattern(namespace)}"
    return None


RULES_HINT = (
    "the complete rule set is redis_fifo_lock.acl_rules() (docs: Running with least privilege)"
)
"""Appended to the messages that name a rule to add."""
