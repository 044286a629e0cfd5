"""The proxy's decisions, made in a worker process within a deadline, off the event loop.

A decision is CEL and Python code over the call's arguments, and a call can be built to make
it slow (a condition that compares every item of a list with every other, given a list of
thousands). The CEL engine holds Python's interpreter lock while it runs, so a decision in a
thread of the proxy's own process would still stop the event loop: no ping answered, no other
call served. So the proxy's gate decides in a child process (`DecisionWorker`):

- the worker builds the same policy from the same text (checked by its hash) and a gate for the
  tools the proxy last listed, and answers `Gate.evaluate` for one call and a copy of the
  ledger (`Ledger.state`), which it sends back as the decision's effect, rule ids, reason, hint
  and outcome;
- the proxy waits for the answer in a thread that sleeps in `poll`, so its event loop keeps
  serving; past the deadline it kills the worker, starts another, and the call is denied
  (`gate:decision_timeout`, a machine fault, never the model's violation);
- the worker only evaluates: the audit record and the ledger's counts are written by the proxy
  (`gated.conclude`), once, whatever the worker did.

What it costs: a copy of the ledger to the worker per call (its size grows with the denied
calls' digests, 16 bytes each) and a round trip on a pipe, well under a millisecond for an
ordinary call; the worker takes about half a second to start, once, and again after each
decision it had to abandon.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from toolpolicy.gate import Decision, Gate, Ledger, Policy
from toolpolicy.types import ToolCall, ToolSpec

DECISION_TIMEOUT = "gate:decision_timeout"
WORKER = "import sys; from toolpolicy.proxy.decisions import worker_main; worker_main(sys.argv[1:])"
"""The worker process's program (`python -c WORKER READ_FD WRITE_FD`)."""


class DecisionWorker:
    """A worker process that evaluates calls with the proxy's policy (see the module docstring).

    Args:
        policy: the proxy's policy; `text` is the YAML it was built from, which the worker
            builds again (and refuses unless its hash is `policy.hash`).
        startup_seconds: how long a new worker may take to start and build the policy.
    """

    def __init__(self, policy: Policy, text: str, startup_seconds: float = 30.0) -> None:
        self.policy = policy
        self.text = text
        self.startup_seconds = startup_seconds
        self._specs: list[tuple[str, dict[str, Any]]] = []
        self._sent_specs: list[tuple[str, dict[str, Any]]] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: _Duplex | None = None
        self._limiter = anyio.CapacityLimiter(1)

    def bind(self, specs: list[ToolSpec]) -> None:
        """The tools to decide for (the proxy's latest listing); sent with the next decision."""
        self._specs = [(spec.name, spec.parameters) for spec in specs]

    async def evaluate(self, call: ToolCall, ledger: Ledger, seconds: float) -> Decision:
        """The gate's answer on `call` (allow, deny or ask, as `Gate.evaluate`), or a denial when
        no answer came within `seconds` or the worker failed. Never raises but for cancellation."""
        try:
            connection = await self._ready()
            if self._sent_specs != self._specs:
                connection.send(("gate", self._specs))
                self._sent_specs = list(self._specs)
            connection.send(("decide", call.name, call.arguments, ledger.state()))
            answered = False
            try:
                answered = await anyio.to_thread.run_sync(connection.poll, seconds, abandon_on_cancel=True, limiter=self._limiter)
            finally:
                if not answered:  # late, or the client cancelled: this worker's answer must never be read
                    self.stop()
            if not answered:
                return timed_out(call.name, seconds)
            reply = connection.recv()
        except (OSError, EOFError, ValueError, TypeError) as error:  # the worker died, or the call could not be sent
            self.stop()
            return _failed(f"the decision worker failed ({type(error).__name__})")
        if reply[0] != "decision":
            self.stop()
            return _failed(str(reply[1]))
        effect, rule_ids, reason, hint, outcome = reply[1:]
        return Decision(effect, tuple(rule_ids), reason, hint, outcome=outcome)

    async def _ready(self) -> _Duplex:
        """The connection to a running worker, starting one if there is none. The worker is a
        fresh interpreter (WORKER, not a fork of the proxy, which
        has threads and an event loop) with no stdin or stdout: those carry the proxy's MCP
        messages. It speaks on two pipes of its own."""
        if self._connection is not None:
            return self._connection
        to_worker, from_proxy = os.pipe()
        to_proxy, from_worker = os.pipe()
        source = str(Path(__file__).resolve().parents[2])  # the toolpolicy this proxy runs
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, "-c", WORKER, str(to_worker), str(from_worker)]
        try:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(to_worker, from_worker), env=environment
            )
        finally:
            os.close(to_worker)
            os.close(from_worker)
        connection = _Duplex(Connection(from_proxy, readable=False), Connection(to_proxy, writable=False))
        self._process, self._sent_specs = process, None
        ready = False
        try:
            connection.send(("policy", self.text, self.policy.source, self.policy.hash))
            if not await anyio.to_thread.run_sync(connection.poll, self.startup_seconds, abandon_on_cancel=True, limiter=self._limiter):
                raise OSError("the decision worker did not start in time")
            try:
                reply = connection.recv()
            except EOFError:
                raise OSError("the decision worker exited as it started") from None
            if reply[0] != "ready":
                raise ValueError(str(reply[1]))
            ready = True
        finally:
            if not ready:  # failed, or cancelled while it started: never half started
                connection.close()
                self.stop()
        self._connection = connection
        return connection

    async def start(self) -> None:
        """Start the worker now (the proxy's start), so the first call does not wait for it.
        ValueError when it cannot build the policy."""
        try:
            await self._ready()
        except OSError as error:
            raise ValueError(str(error)) from None

    def stop(self) -> None:
        """Kill the worker (it is started again on the next decision)."""
        connection, process = self._connection, self._process
        self._connection, self._process, self._sent_specs = None, None, None
        if connection is not None:
            connection.close()
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(5)


class _Duplex:
    """The proxy's end of the two pipes to a worker: it sends on one and receives on the other."""

    def __init__(self, out: Connection, into: Connection) -> None:
        self._out, self._into = out, into

    def send(self, message: tuple[Any, ...]) -> None:
        self._out.send(message)

    def poll(self, seconds: float) -> bool:
        return self._into.poll(seconds)

    def recv(self) -> Any:
        return self._into.recv()

    def close(self) -> None:
        self._out.close()
        self._into.close()


def timed_out(name: str, seconds: float) -> Decision:
    """The denial of a call the gate did not decide on in time."""
    return Decision(
        "deny",
        (DECISION_TIMEOUT,),
        f"the policy gate did not decide on this call to {name:.60} within {seconds:g} s.",
        "Try a smaller or simpler call.",
        outcome="gate_error",
    )


def _failed(detail: str) -> Decision:
    return Decision("deny", ("gate:error",), f"the policy gate failed: {detail}.", outcome="gate_error")


def _serve(connection: _Duplex) -> None:
    """The worker: build the policy of the first message, ("policy", text, source, hash), then
    answer ("gate", specs) and ("decide", name, arguments, ledger state) messages until the proxy
    closes its pipe."""
    try:
        _, text, source, expected_hash = connection.recv()
    except (EOFError, OSError):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the proxy showed the policy's warnings when it loaded it
        try:
            policy = Policy.from_yaml(text, source)
        except Exception as error:
            connection.send(("error", f"the decision worker could not load the policy: {error}"))
            return
    if policy.hash != expected_hash:
        connection.send(("error", f"{source} changed on disk after the proxy loaded it; restart the proxy"))
        return
    connection.send(("ready", policy.hash))
    gate: Gate | None = None
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        try:
            if message[0] == "gate":
                gate = Gate(policy, [ToolSpec(name, "", parameters) for name, parameters in message[1]], strict_tool_names=False)
                continue
            _, name, arguments, state = message
            assert gate is not None, "no tools were bound"
            decision = gate.evaluate(ToolCall(name, arguments), Ledger.from_state(state))
            reply: tuple[Any, ...] = ("decision", decision.effect, decision.rule_ids, decision.reason, decision.hint, decision.outcome)
        except Exception as error:  # fail closed, naming only the kind of failure
            reply = ("error", f"the decision worker failed ({type(error).__name__})")
        connection.send(reply)


def worker_main(descriptors: list[str]) -> None:
    """The worker process's entry (see WORKER): the pipe it reads and the pipe it writes."""
    reads, writes = (int(fd) for fd in descriptors)
    _serve(_Duplex(Connection(writes, readable=False), Connection(reads, writable=False)))
