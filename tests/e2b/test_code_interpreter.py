"""The registry `e2b-code-interpreter` Python SDK, unmodified, against a real `sandcell serve`:
the `code-interpreter-v1` template (its server on port 49999, reached through the daemon's
port proxy by the SDK's E2b-Sandbox-Id/E2b-Sandbox-Port headers).

Run through tests/e2b/run.sh (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY set), with the
`code-interpreter-v1` image installed (`make images install`).
"""

import os
import time

import httpx
import pytest
from e2b import TimeoutException
from e2b_code_interpreter import Sandbox

API = os.environ.get("E2B_API_URL", "")


@pytest.fixture(scope="module")
def sbx():
    sandbox = Sandbox.create(timeout=300)  # the SDK's default template: code-interpreter-v1
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_results_logs_and_state_between_cells(sbx):
    ex = sbx.run_code("x = 40\nprint('side', 'effect')\nx + 2")
    assert ex.error is None
    assert ex.text == "42"
    assert ex.logs.stdout == ["side effect\n"]
    assert ex.execution_count >= 1
    # The kernel keeps its state between cells.
    assert sbx.run_code("x * 10").text == "400"


def test_errors_come_back_as_execution_errors(sbx):
    ex = sbx.run_code("1/0")
    assert ex.error is not None
    assert ex.error.name == "ZeroDivisionError"
    assert ex.error.value == "division by zero"
    assert "ZeroDivisionError" in ex.error.traceback
    ex = sbx.run_code("import sys; print('to stderr', file=sys.stderr)")
    assert ex.logs.stderr == ["to stderr\n"]


def test_streaming_callbacks_and_rich_results(sbx):
    seen = []
    ex = sbx.run_code(
        "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)",
        on_stdout=lambda m: seen.append(m.line),
    )
    assert "".join(seen) == "0\n1\n2\n"
    assert ex.logs.stdout == seen
    # A matplotlib figure is a PNG display result; a DataFrame has an HTML one.
    ex = sbx.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"
    )
    assert ex.error is None, ex.error
    assert any(r.png for r in ex.results), [r.formats() for r in ex.results]
    ex = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    assert ex.error is None, ex.error
    assert ex.results[-1].is_main_result
    assert "<table" in (ex.results[-1].html or "")


def test_figures_carry_their_chart_data(sbx):
    # E2B's `result.chart`, beside the PNG: read from the figure's artists by the kernels'
    # extension (images/code-interpreter-v1/sandcell_charts.py)
    ex = sbx.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9], label='squares')\n"
        "plt.title('Squares'); plt.xlabel('n'); plt.ylabel('n^2'); plt.show()"
    )
    fig = next(r for r in ex.results if r.chart)
    assert fig.png and "chart" in fig.formats()
    chart = fig.chart
    assert (chart.type.value, chart.title, chart.x_label, chart.y_label) == ("line", "Squares", "n", "n^2")
    assert chart.x_scale.value == "linear" and chart.x_ticks and len(chart.x_tick_labels) == len(chart.x_ticks)
    assert [(e.label, e.points) for e in chart.elements] == [("squares", [(1, 1), (2, 4), (3, 9)])]
    bars = next(r.chart for r in sbx.run_code(
        "plt.bar(['red', 'blue'], [3, 5], label='votes'); plt.show()").results if r.chart)
    assert bars.type.value == "bar" and bars.x_label is None
    assert [(e.label, e.group, e.value) for e in bars.elements] == [("red", "votes", 3), ("blue", "votes", 5)]
    pie = next(r.chart for r in sbx.run_code(
        "plt.pie([1, 3], labels=['one', 'three']); plt.show()").results if r.chart)
    assert pie.type.value == "pie"
    assert [(e.label, round(e.angle)) for e in pie.elements] == [("one", 90), ("three", 270)]
    both = next(r.chart for r in sbx.run_code(
        "fig, (a, b) = plt.subplots(1, 2); a.scatter([1, 2], [3, 4]); b.plot([0, 1])\n"
        "fig.suptitle('Two'); plt.show()").results if r.chart)
    assert (both.type.value, both.title) == ("superchart", "Two")
    box = next(r.chart for r in sbx.run_code(
        "fig, ax = plt.subplots(); ax.boxplot([[1, 2, 3, 4, 5, 40], [2, 3, 4]]); "
        "ax.set_title('Spread'); plt.show()").results if r.chart)
    assert (box.type.value, box.title) == ("box_and_whisker", "Spread")
    first, second = box.elements
    assert (first.label, first.min, first.first_quartile, first.median) == ("1", 1, 2.25, 3.5)
    assert (first.third_quartile, first.max, first.outliers) == (4.75, 5, [40])
    assert (second.label, second.median, second.outliers) == ("2", 3, [])
    assert [c.type.value for c in both.elements] == ["scatter", "line"]
    assert both.elements[0].elements[0].points == [(1.0, 3.0), (2.0, 4.0)]


def test_env_vars_apply_to_one_execution(sbx):
    assert sbx.run_code("import os; os.environ.get('ONLY_HERE')", envs={"ONLY_HERE": "yes"}).text == "'yes'"
    assert sbx.run_code("import os; os.environ.get('ONLY_HERE')").text is None


def test_contexts_are_separate_kernels(sbx):
    ctx = sbx.create_code_context(cwd="/tmp")
    assert ctx.cwd == "/tmp" and ctx.language == "python"
    assert sbx.run_code("import os; os.getcwd()", context=ctx).text == "'/tmp'"
    sbx.run_code("y = 'in ctx'", context=ctx)
    assert sbx.run_code("y", context=ctx).text == "'in ctx'"
    assert sbx.run_code("y").error.name == "NameError"
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.restart_code_context(ctx)
    assert sbx.run_code("y", context=ctx).error.name == "NameError"
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]


def test_bash_runs_in_a_kernel_of_its_own_with_state_and_envs(sbx):
    ex = sbx.run_code("N=6; echo from bash; echo $((N * 7))", language="bash")
    assert ex.error is None, ex.error
    assert ex.logs.stdout == ["from bash\n", "42\n"] or "".join(ex.logs.stdout) == "from bash\n42\n"
    # the language's default context keeps its shell's state, apart from Python's
    assert "".join(sbx.run_code("echo $N", language="bash").logs.stdout) == "6\n"
    assert sbx.run_code("N").error.name == "NameError"
    # an execution's env vars, for that execution only; the sandbox's own stay
    seen = sbx.run_code('echo "$ONLY_HERE|$E2B_SANDBOX_ID"', language="bash", envs={"ONLY_HERE": "it's here"})
    assert "".join(seen.logs.stdout) == f"it's here|{sbx.sandbox_id}\n"
    assert "".join(sbx.run_code('echo "${ONLY_HERE-unset}"', language="bash").logs.stdout) == "unset\n"
    # a failing command is the execution's error (its exit status)
    failed = sbx.run_code("false", language="bash")
    assert failed.error is not None and failed.error.value == "1"
    for envs, why in (
        ({"NOT-A-NAME": "x"}, "shell variable name"),
        ({"PS1": "$ "}, "prompt"),  # the kernel would wait for its prompt forever
        ({"LINE": "a\x15b"}, "control characters"),  # ^U would rewrite the line
    ):
        with pytest.raises(Exception) as exc:
            sbx.run_code("true", language="bash", envs=envs)
        assert why in str(exc.value)
    assert "".join(sbx.run_code("echo still here", language="bash").logs.stdout) == "still here\n"
    ctx = sbx.create_code_context(language="bash", cwd="/tmp")
    assert ctx.language == "bash"
    assert "".join(sbx.run_code("pwd; echo ${N-none}", context=ctx).logs.stdout) == "/tmp\nnone\n"
    sbx.remove_code_context(ctx)


def test_javascript_runs_in_a_node_kernel_with_state_streams_and_errors(sbx):
    seen = []
    ex = sbx.run_code(
        "const n = 6\n"
        "for (let i = 0; i < 3; i++) { console.log('tick', i); await new Promise((r) => setTimeout(r, 200)) }\n"
        "n * 7",
        language="javascript",
        on_stdout=seen.append,
    )
    assert ex.error is None, ex.error
    assert ex.text == "42"
    assert "".join(m.line for m in seen) == "tick 0\ntick 1\ntick 2\n"
    assert ex.logs.stdout == [m.line for m in seen]
    # streamed while the cell ran (the server stamps each when it reads it), not at its end
    assert seen[-1].timestamp - seen[0].timestamp >= 300_000_000, [m.timestamp for m in seen]
    # the language's default context ("js" names it too) keeps its state, apart from Python's
    assert sbx.run_code("n + 1", language="js").text == "7"
    assert sbx.run_code("n").error.name == "NameError"
    # the last expression as util.inspect shows it (an object literal as node's REPL reads it)
    ex = sbx.run_code("console.error('to stderr'); ({a: [1, 'two']})", language="javascript")
    assert (ex.text, ex.logs.stderr) == ("{ a: [ 1, 'two' ] }", ["to stderr\n"])
    assert sbx.run_code("{b: 2}", language="javascript").text == "{ b: 2 }"
    assert sbx.run_code("let nothing", language="javascript").results == []
    failed = sbx.run_code("function far() { throw new RangeError('too far') }\nfar()", language="javascript")
    assert (failed.error.name, failed.error.value) == ("RangeError", "too far")
    assert "RangeError: too far" in failed.error.traceback and "at far (" in failed.error.traceback
    assert sbx.run_code("n", language="javascript").text == "6"
    # output larger than a pipe holds comes whole, before the cell's end (node queues what a
    # full pipe does not take, and writes it after the cell's code returned)
    flood = sbx.run_code(
        "console.log('x'.repeat(3e6))\nfor (let i = 0; i < 50000; i++) console.log(i)\n'done'", language="javascript"
    )
    assert flood.text == "'done'"
    assert "".join(flood.logs.stdout) == "x" * 3_000_000 + "\n" + "".join(f"{i}\n" for i in range(50000))


def test_javascript_envs_and_contexts_with_their_cwd(sbx):
    code = "process.env.ONLY_HERE ?? 'unset'"
    assert sbx.run_code(code, language="javascript", envs={"ONLY_HERE": "it's here"}).text == '"it\'s here"'
    assert sbx.run_code(code, language="javascript").text == "'unset'"
    # the sandbox's own env vars are there
    assert sbx.run_code("process.env.E2B_SANDBOX_ID", language="javascript").text == repr(sbx.sandbox_id)
    ctx = sbx.create_code_context(language="javascript", cwd="/tmp")
    assert (ctx.language, ctx.cwd) == ("javascript", "/tmp")
    assert sbx.run_code("process.cwd()", context=ctx).text == "'/tmp'"
    assert sbx.run_code("require('node:fs').writeFileSync('js-was-here', 'x'); typeof n", context=ctx).text == "'undefined'"
    assert sbx.files.exists("/tmp/js-was-here")
    assert sbx.run_code("process.cwd()", language="javascript").text == "'/home/user'"
    sbx.remove_code_context(ctx)


def test_a_timed_out_javascript_cell_is_interrupted(sbx):
    sbx.run_code("let kept = 'kept'", language="javascript")
    # a loop (stopped by SIGINT in node) and a pending await, each past its timeout
    for code in ("while (true) {}\nkept = 'lost'", "await new Promise(() => {})\nkept = 'lost'"):
        with pytest.raises(TimeoutException):
            sbx.run_code(code, language="javascript", timeout=2)
        # interrupted: the context is usable at once, its state kept
        assert sbx.run_code("kept", language="javascript", timeout=20).text == "'kept'"
    # A loop after an await is out of SIGINT's reach (node's event loop never gets to it):
    # the kernel kills that node and starts another, so the context is usable, its state gone.
    with pytest.raises(TimeoutException):
        sbx.run_code("await null\nwhile (true) {}", language="javascript", timeout=2)
    assert sbx.run_code("typeof kept", language="javascript", timeout=20).text == "'undefined'"
    # No node left behind, by that restart or by the removed contexts' kernels (killed with
    # SIGKILL: their node goes with them by PR_SET_PDEATHSIG): the default JS context's only.
    ps = sbx.commands.run("ps -eo args").stdout.splitlines()
    assert len([p for p in ps if "js_driver.js" in p and "ps -eo" not in p]) == 1, ps


def test_other_languages_are_refused_with_a_reason(sbx):
    with pytest.raises(Exception) as exc:
        sbx.run_code("1", language="r")
    assert "not installed" in str(exc.value)


def test_a_timed_out_execution_is_interrupted(sbx):
    with pytest.raises(TimeoutException):
        sbx.run_code("import time\ntime.sleep(60)\nfinished = True", timeout=2)
    # The kernel was interrupted (KeyboardInterrupt in the cell): `finished` was never set,
    # and the next cell runs instead of queueing behind the sleep (which would outlast its
    # 20 s and fail it).
    assert sbx.run_code("'finished' in globals()", timeout=20).text == "False"
    assert sbx.run_code("x", timeout=20).text == "40"


def _metric(series):
    r = httpx.get(f"{API}/metrics", timeout=30)
    r.raise_for_status()
    for line in r.text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"/metrics has no {series}")


def _restored_creates():
    return _metric('sandcell_template_creates_total{path="restored"}')


# Last in the module: the fixture's create (booted) had the daemon snapshot the template in
# the background (templates/installed_snapshot.rs) while the tests above ran.
def test_later_creates_restore_the_snapshot_with_their_own_env(sbx):
    deadline = time.time() + 300
    taken = 'sandcell_installed_template_snapshots_total{outcome="taken"}'
    failed = 'sandcell_installed_template_snapshots_total{outcome="failed"}'
    while _metric(taken) + _metric(failed) == 0:
        assert time.time() < deadline, "the template's snapshot was neither taken nor failed in 300 s"
        time.sleep(1)
    assert (_metric(taken), _metric(failed)) == (1, 0)
    before = _restored_creates()
    begun = time.monotonic()
    second = Sandbox.create(timeout=120, envs={"CREATE_LEVEL": "second"})
    try:
        first_cell = second.run_code("import os; os.environ.get('CREATE_LEVEL')")
        print(f"restored create + first cell: {time.monotonic() - begun:.2f} s")
        assert _restored_creates() == before + 1, "the create did not restore the template's snapshot"
        # The kernel was started at the snapshot, yet sees this create's env vars and identity.
        assert first_cell.text == "'second'"
        assert second.run_code("os.environ.get('E2B_SANDBOX_ID')").text == repr(second.sandbox_id)
        # Nothing of another sandbox's kernel: `x` is the fixture's, not the snapshot's.
        assert second.run_code("x").error.name == "NameError"
        assert second.run_code("z = 5\nz * 2").text == "10"
        rolls = second.run_code("import random; (random.random(), os.urandom(8).hex())").text
    finally:
        second.kill()
    third = Sandbox.create(timeout=120)
    try:
        # Another create's env vars are gone again, and its state is its own.
        assert third.run_code("import os; os.environ.get('CREATE_LEVEL')").text is None
        assert third.run_code("z").error.name == "NameError"
        # Both kernels come from one memory image, yet draw different random numbers.
        other = third.run_code("import random; (random.random(), os.urandom(8).hex())").text
        assert other != rolls and other.split(",")[0] != rolls.split(",")[0], (rolls, other)
        assert _restored_creates() == before + 2
        # Its default context removed, a cell without a context says what to do instead.
        (default,) = third.list_code_contexts()
        third.remove_code_context(default)
        with pytest.raises(Exception) as exc:
            third.run_code("1")
        assert "default context was removed" in str(exc.value)
    finally:
        third.kill()
