// E2B `Template.build` with the registry `e2b` npm SDK, unmodified, against a real
// `sandcell serve` (run by tests/e2b/run.sh, environment as sdk.cjs). The same round trip
// as test_template.py: one build from the test template with a RUN step, a COPY of a local
// file (uploaded through the daemon's files URL), ENV, WORKDIR and a start + ready command;
// then a sandbox from the result sees the file, the variables, the working directory and
// what the start command wrote. The file and the RUN command differ from the Python test's,
// so that this build uploads and runs them itself instead of finding them in the daemon's
// caches. Exits non-zero on any failed check.
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { Sandbox, Template } = require('e2b')

const base = process.env.SANDCELL_TEMPLATE
assert.ok(base, 'SANDCELL_TEMPLATE is not set (run through tests/e2b/run.sh)')

async function main() {
  const context = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-e2b-js-'))
  const name = `e2b-built-js-${process.pid}`
  let sbx
  try {
    fs.writeFileSync(path.join(context, 'hello.txt'), 'hello from the node build context\n')
    const template = Template({ fileContextPath: context })
      .fromTemplate(base)
      // E2B's steps run as `user` in /home/user unless told otherwise.
      .runCmd('whoami > who.txt; pwd >> who.txt # node')
      .runCmd('mkdir -p /srv/app && echo built-by-node-run > /srv/app/run.txt', { user: 'root' })
      .copy('hello.txt', '/srv/app/')
      .setEnvs({ GREETING: 'hi there', ORIGIN: 'e2b' })
      .setWorkdir('/srv/app')
      .setStartCmd('echo started-by-start-cmd > /tmp/started; sleep 3600', 'test -s /tmp/started')

    const logs = []
    const info = await Template.build(template, name, {
      onBuildLogs: (entry) => logs.push(entry),
      cpuCount: 1,
      memoryMB: 512,
    })
    assert.equal(info.templateId, name)
    const messages = logs.map((e) => e.message)
    assert.ok(messages.some((m) => m.includes("Uploaded 'hello.txt'")), JSON.stringify(messages))
    assert.ok(messages.some((m) => m.includes('RUN') && m.includes('built-by-node-run')), JSON.stringify(messages))
    // The test's own steps were built here, not taken from the cache (E2B's default
    // `WORKDIR /home/user` before them may be).
    for (const own of ['# node', 'built-by-node-run']) {
      const at = messages.findIndex((m) => m.includes('RUN') && m.includes(own))
      assert.ok(at >= 0 && messages[at + 1] !== 'CACHED', JSON.stringify(messages))
    }
    assert.equal(await Template.exists(name), true)
    console.log(`ok   Template.build ${name} (${logs.length} log entries)`)

    sbx = await Sandbox.create(name, { timeoutMs: 120_000 })
    const r = await sbx.commands.run('cat hello.txt run.txt; echo $GREETING/$ORIGIN; pwd; whoami')
    assert.equal(r.stdout, 'hello from the node build context\nbuilt-by-node-run\nhi there/e2b\n/srv/app\nuser\n')
    assert.equal((await sbx.commands.run('cat /home/user/who.txt')).stdout, 'user\n/home/user\n')
    console.log('ok   the COPY, RUN, ENV and WORKDIR steps are in the sandbox')
    // The start command ran (once, at build time: the template is its memory snapshot).
    assert.equal((await sbx.commands.run('cat /tmp/started')).stdout, 'started-by-start-cmd\n')
    console.log('ok   the start command ran before the create answered')
    // The build's cpuCount/memoryMB are the template's default size.
    const got = await Sandbox.getInfo(sbx.sandboxId)
    assert.deepEqual([got.cpuCount, got.memoryMB], [1, 512])
    console.log('ok   cpuCount/memoryMB of the build are the sandbox size')
  } finally {
    if (sbx) await sbx.kill()
    fs.rmSync(context, { recursive: true, force: true })
  }
}

main().catch((e) => {
  console.log(`FAIL ${e && e.stack ? e.stack : e}`)
  process.exitCode = 1
})
