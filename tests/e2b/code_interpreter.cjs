// The registry `@e2b/code-interpreter` npm SDK, unmodified, against a real `sandcell serve`:
// the `code-interpreter-v1` template (its server on port 49999, reached through the daemon's
// port proxy by the SDK's E2b-Sandbox-Id/E2b-Sandbox-Port headers). Run by tests/e2b/run.sh
// (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, NODE_PATH). Exits non-zero on a failed check.
const assert = require('node:assert/strict')
const { Sandbox } = require('@e2b/code-interpreter')

const { check } = require('./check.cjs')

async function main() {
  // The SDK's default template: code-interpreter-v1.
  const sbx = await Sandbox.create({ timeoutMs: 300_000 })
  try {
    await check('runCode: a result, stdout, state between cells', async () => {
      const ex = await sbx.runCode("n = 6\nprint('from', 'node')\nn * 7")
      assert.equal(ex.error, undefined)
      assert.equal(ex.text, '42')
      assert.deepEqual(ex.logs.stdout, ['from node\n'])
      assert.ok(ex.executionCount >= 1)
      assert.equal((await sbx.runCode('n + 1')).text, '7')
    })
    await check('runCode: streamed stdout, a matplotlib PNG, a DataFrame', async () => {
      const seen = []
      const ex = await sbx.runCode(
        'import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)',
        { onStdout: (m) => seen.push(m.line) })
      assert.equal(seen.join(''), '0\n1\n2\n')
      const results = []
      const fig = await sbx.runCode(
        'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()',
        { onResult: (r) => results.push(r) })
      assert.equal(fig.error, undefined)
      const png = fig.results.find((r) => r.png)
      assert.ok(png, JSON.stringify(fig.results.map((r) => r.formats())))
      assert.ok(Buffer.from(png.png, 'base64').subarray(0, 4).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47])))
      assert.ok(results.some((r) => r.png), 'onResult saw the figure')
      // E2B's chart data, beside the PNG
      assert.equal(png.chart.type, 'line')
      assert.deepEqual(png.chart.elements.map((e) => e.points), [[[1, 1], [2, 4], [3, 9]]])
      assert.equal(png.chart.title, null)
      const df = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
      assert.ok(df.results.at(-1).isMainResult)
      assert.match(df.results.at(-1).html, /<table/)
    })
    await check('runCode: an error with name, value and traceback', async () => {
      const errors = []
      const ex = await sbx.runCode("raise ValueError('bad input')", { onError: (e) => errors.push(e) })
      assert.equal(ex.error.name, 'ValueError')
      assert.equal(ex.error.value, 'bad input')
      assert.match(ex.error.traceback, /ValueError/)
      assert.equal(errors.length, 1)
    })
    await check('runCode: env vars for one execution', async () => {
      const code = "import os; os.environ.get('ONLY_HERE')"
      assert.equal((await sbx.runCode(code, { envs: { ONLY_HERE: 'node' } })).text, "'node'")
      assert.equal((await sbx.runCode(code)).text, undefined)
    })
    await check('contexts: create with cwd, own state, list, restart, remove', async () => {
      const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
      assert.equal(ctx.cwd, '/tmp')
      assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, "'/tmp'")
      await sbx.runCode("only = 'ctx'", { context: ctx })
      assert.equal((await sbx.runCode('only', { context: ctx })).text, "'ctx'")
      assert.equal((await sbx.runCode('only')).error.name, 'NameError')
      assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
      await sbx.restartCodeContext(ctx)
      assert.equal((await sbx.runCode('only', { context: ctx })).error.name, 'NameError')
      await sbx.removeCodeContext(ctx)
      assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
    })
    await check('runCode: a timeout interrupts the cell', async () => {
      await assert.rejects(sbx.runCode('import time\ntime.sleep(60)\ndone = True', { timeoutMs: 2000 }))
      assert.equal((await sbx.runCode("'done' in globals()", { timeoutMs: 20_000 })).text, 'False')
      assert.equal((await sbx.runCode('n', { timeoutMs: 20_000 })).text, '6')
    })
    await check('runCode: bash in a kernel of its own, with its state and envs', async () => {
      const ex = await sbx.runCode('X=7; echo $((X * 6))', { language: 'bash' })
      assert.equal(ex.error, undefined)
      assert.equal(ex.logs.stdout.join(''), '42\n')
      const again = await sbx.runCode('echo "$X $FROM"', { language: 'bash', envs: { FROM: 'node' } })
      assert.equal(again.logs.stdout.join(''), '7 node\n')
      assert.equal((await sbx.runCode('echo ${FROM-gone}', { language: 'bash' })).logs.stdout.join(''), 'gone\n')
    })
    await check('runCode: JavaScript in a node kernel: state, streamed console, result, error', async () => {
      const seen = []
      const ex = await sbx.runCode(
        "const m = 6\nfor (const w of ['a', 'b', 'c']) { console.log(w); await new Promise((r) => setTimeout(r, 200)) }\nm * 7",
        { language: 'javascript', onStdout: (o) => seen.push(o) })
      assert.equal(ex.error, undefined)
      assert.equal(ex.text, '42')
      assert.equal(seen.map((o) => o.line).join(''), 'a\nb\nc\n')
      // streamed while the cell ran, not at its end: this SDK stamps each line when it gets it
      // (Date.now() * 1000, microseconds)
      assert.ok(seen.at(-1).timestamp - seen[0].timestamp >= 300e3, JSON.stringify(seen))
      // the language's default context ("js" too) keeps its state
      assert.equal((await sbx.runCode('m + 1', { language: 'js' })).text, '7')
      const errors = []
      const failed = await sbx.runCode('const o = null\no.field', { language: 'javascript', onError: (e) => errors.push(e) })
      assert.equal(failed.error.name, 'TypeError')
      assert.match(failed.error.value, /Cannot read properties of null/)
      assert.match(failed.error.traceback, /TypeError/)
      assert.equal(errors.length, 1)
    })
    await check('runCode: JavaScript envs, a context with its cwd, a timeout', async () => {
      const code = "process.env.FROM ?? 'unset'"
      assert.equal((await sbx.runCode(code, { language: 'javascript', envs: { FROM: 'node' } })).text, "'node'")
      assert.equal((await sbx.runCode(code, { language: 'javascript' })).text, "'unset'")
      const ctx = await sbx.createCodeContext({ language: 'javascript', cwd: '/tmp' })
      assert.equal(ctx.language, 'javascript')
      assert.equal((await sbx.runCode('process.cwd()', { context: ctx })).text, "'/tmp'")
      assert.equal((await sbx.runCode('typeof m', { context: ctx })).text, "'undefined'")
      await sbx.removeCodeContext(ctx)
      await assert.rejects(sbx.runCode("while (true) {}\nm = 'lost'", { language: 'javascript', timeoutMs: 2000 }))
      assert.equal((await sbx.runCode('m', { language: 'javascript', timeoutMs: 20_000 })).text, '6')
    })
    await check('runCode: a language the template lacks is refused', async () => {
      // A 400 (the server's message says which languages there are; this SDK shows a 400's
      // body only with its diagnostics on, tests/e2b/test_code_interpreter.py reads it)
      await assert.rejects(sbx.runCode('1', { language: 'r' }), /400/)
    })
  } finally {
    await sbx.kill()
  }
}

main().catch((e) => {
  console.log(`FAIL ${e && e.stack ? e.stack : e}`)
  process.exitCode = 1
})
