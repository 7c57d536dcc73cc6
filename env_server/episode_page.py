"""The episode viewer's HTML: the recent episodes as a table, and one episode as a conversation.

Rendered on the server from `EpisodeRecord`s, with every recorded string escaped; no script runs in
the page. A record holds what the agent sent and saw, the grade's counts and the monitor's flags,
never a hidden test or an expected value (the grader keeps those), so the page cannot show them.
"""

from __future__ import annotations

import json
import time
from html import escape
from typing import Any

from env_server.models import CallResult, EpisodeRecord, EpisodeSummary, TrajectoryStep

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; padding: 0 1rem; color: #1d1d1f; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 1.6rem; }
table { border-collapse: collapse; width: 100%; } th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid #ddd; }
th { background: #f4f4f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.turn { border-radius: 8px; padding: .6rem .9rem; margin: .7rem 0; }
.user { background: #eef3ff; } .assistant { background: #f3f0ff; } .tool { background: #f6f6f6; } .end { background: #eefaf0; }
.role { font-weight: 600; font-size: .8rem; text-transform: uppercase; letter-spacing: .04em; color: #555; }
pre { white-space: pre-wrap; word-break: break-word; margin: .3rem 0; font: 13px/1.4 ui-monospace, monospace; }
.kind { display: inline-block; background: #ffe3e0; color: #8a1c12; border-radius: 4px; padding: 0 .4rem; font-size: .8rem; }
.flag { display: inline-block; background: #fff3cd; color: #6b4e00; border-radius: 4px; padding: 0 .4rem; font-size: .8rem; }
.hint { border-left: 3px solid #c9a400; padding-left: .6rem; color: #5a4a00; }
.muted { color: #777; font-size: .85rem; }
"""


def index_page(summaries: list[EpisodeSummary], kept: int) -> str:
    """The recent episodes, newest first, each linking to its conversation."""
    if not summaries:
        body = "<p>No episode has ended yet. Episodes appear here when they are graded, fail, or are left by a reset or a close.</p>"
    else:
        rows = "".join(_summary_row(summary) for summary in summaries)
        body = (
            "<table><thead><tr><th>ended</th><th>task</th><th>ending</th><th>reward</th><th>tests</th>"
            f"<th>steps</th><th>error kinds</th><th>monitor flags</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    return _page("Recent episodes", f"<h1>Recent episodes</h1><p class=muted>The last {kept} ended episodes this service kept, newest first.</p>{body}")


def episode_page(record: EpisodeRecord) -> str:
    """One episode as the conversation the agent had: the task, each action and what it was answered."""
    summary = EpisodeSummary.of(record)
    head = (
        f"<h1>{escape(record.task_id)}</h1><p class=muted>episode {escape(record.episode_id)} · session "
        f"{escape(record.session_id)} · {_when(record.started_at)} · <a href='../viewer'>all episodes</a></p>"
        f"<p>Ending: <b>{escape(_ending(summary))}</b> · reward <b>{_reward(record.reward)}</b> · tests {_tests(summary)}"
        f" · {len(record.steps)} steps{_flags(record.monitor_flags)}</p>"
    )
    turns = [_turn("user", "task", f"<pre>{escape(record.prompt)}</pre>")]
    for step in record.steps:
        turns += _step_turns(step)
    turns.append(_turn("end", "episode ended", f"{escape(_ending(summary))} · reward {_reward(record.reward)} · tests {_tests(summary)}"))
    return _page(f"{record.task_id} · episode", head + "".join(turns))


def not_found_page(episode_id: str, kept: int) -> str:
    """What `/viewer/{id}` shows for an episode it does not keep."""
    body = (f"<h1>No episode {escape(episode_id)}</h1><p>The service keeps the last {kept} ended episodes; this is not one of "
            "them (an episode still going on is read with <code>GET /sessions/{id}/trajectory</code>). "
            "<a href='../viewer'>All episodes</a></p>")
    return _page("Episode not found", body)


def login_page(failed: bool = False) -> str:
    """The form that exchanges the service's bearer token for a viewer cookie (the page cannot send a header)."""
    note = "<p class=kind>That token is not this service's.</p>" if failed else ""
    form = (
        "<form method=post action='login'><label>Bearer token of the service <input type=password name=token autofocus></label> "
        "<button type=submit>Open the viewer</button></form>"
    )
    return _page("Episode viewer: sign in", f"<h1>Episode viewer</h1>{note}{form}")


def _summary_row(summary: EpisodeSummary) -> str:
    kinds = ", ".join(f"{escape(kind)} ×{count}" for kind, count in sorted(summary.error_kinds.items()))
    return (
        f"<tr><td>{_when(summary.ended_at)}</td><td><a href='viewer/{escape(summary.episode_id)}'>{escape(summary.task_id)}</a></td>"
        f"<td>{escape(_ending(summary))}</td><td class=num>{_reward(summary.reward)}</td><td class=num>{_tests(summary)}</td>"
        f"<td class=num>{summary.steps}</td><td>{kinds or '—'}</td><td>{escape(', '.join(summary.monitor_flags)) or '—'}</td></tr>"
    )


def _step_turns(step: TrajectoryStep) -> list[str]:
    action: dict[str, Any] = step.action
    if action.get("type") == "assistant_message":
        said = f"<pre>{escape(str(action.get('content', '')))}</pre>"
    else:
        said = _call_text(str(action.get("tool_name", "?")), action.get("arguments"))
    turns = [_turn("assistant", f"step {step.index + 1}", said)]
    # Each answer names its call when the action does not already show it: calls parsed out of a
    # message's text, or several calls in one step.
    named = action.get("type") == "assistant_message" or len(step.observation.calls) > 1
    for call in step.observation.calls:
        turns.append(_turn("tool", _call_title(call), _call_body(call, named)))
    return turns


def _call_title(call: CallResult) -> str:
    title = f"{call.tool_name} answered"
    if call.exit_code is not None:
        title += f" (exit {call.exit_code})"
    return title


def _call_body(call: CallResult, named: bool) -> str:
    parts = []
    if named and call.arguments is not None:
        parts.append(f"<div class=muted>{_call_text(call.tool_name, call.arguments)}</div>")
    if call.error_kind is not None:
        parts.append(f"<span class=kind>{escape(call.error_kind.value)}</span>")
    if not call.ran:
        parts.append("<span class=muted> not run</span>")
    parts.append(f"<pre>{escape(call.output)}</pre>")
    if call.truncated:
        parts.append("<div class=muted>output truncated</div>")
    if call.hint:
        parts.append(f"<div class=hint>hint: {escape(call.hint)}</div>")
    parts.append(_flags(call.monitor_flags))
    return "".join(parts)


def _call_text(tool: str, arguments: Any) -> str:
    shown = json.dumps(arguments, indent=1, ensure_ascii=False) if not isinstance(arguments, str) else arguments
    return f"<b>{escape(tool)}</b><pre>{escape(shown)}</pre>"


def _turn(kind: str, role: str, body: str) -> str:
    return f"<div class='turn {kind}'><div class=role>{escape(role)}</div>{body}</div>"


def _flags(flags: list[str]) -> str:
    return "".join(f" <span class=flag>{escape(flag)}</span>" for flag in flags)


def _ending(summary: EpisodeSummary) -> str:
    return summary.ending.value if summary.ending is not None else "going on"


def _reward(reward: float | None) -> str:
    return "—" if reward is None else f"{reward:g}"


def _tests(summary: EpisodeSummary) -> str:
    return "—" if summary.tests_total is None else f"{summary.tests_passed}/{summary.tests_total}"


def _when(timestamp: float | None) -> str:
    return "—" if timestamp is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
        f"<meta name=viewport content='width=device-width, initial-scale=1'><style>{STYLE}</style></head><body>{body}</body></html>"
    )
