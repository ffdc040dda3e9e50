// The registry `e2b` npm SDK, unmodified, against a real `sandcell serve` (run by
// tests/e2b/run.sh, which sets E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, SANDCELL_TEMPLATE
// and NODE_PATH). Exits non-zero on the first failed check.
const assert = require('node:assert/strict')
const { Sandbox, AuthenticationError, CommandExitError, NotFoundError, TimeoutError, SandboxNotFoundError } = require('e2b')

const template = process.env.SANDCELL_TEMPLATE

const { check } = require('./check.cjs')

async function main() {
  let sbx
  await check('create', async () => {
    sbx = await Sandbox.create(template, { timeoutMs: 120_000, metadata: { suite: 'node' }, envs: { FOO: 'node-env' } })
    assert.ok(sbx.sandboxId)
  })
  if (!sbx) return
  await check('commands.run', async () => {
    const r = await sbx.commands.run('echo hi $FOO')
    assert.equal(r.stdout, 'hi node-env\n')
    assert.equal(r.exitCode, 0)
  })
  await check('commands: exit code, user, background kill', async () => {
    await assert.rejects(sbx.commands.run('echo out; exit 5'), (e) =>
      e instanceof CommandExitError && e.exitCode === 5 && e.stdout === 'out\n')
    assert.equal((await sbx.commands.run('whoami', { user: 'user' })).stdout, 'user\n')
    assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
    const bg = await sbx.commands.run('sleep 300', { background: true })
    assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid))
    assert.equal(await bg.kill(), true)
    await assert.rejects(bg.wait(), (e) => e instanceof CommandExitError)
  })
  if (template === 'base') {
    await check('sudo for user (the agent serves it on gvisor) and node/npm', async () => {
      const run = async (cmd) => (await sbx.commands.run(cmd, { user: 'user' })).stdout
      assert.equal(await run('sudo id -u'), '0\n')
      assert.equal(await run('sudo -u user -i sh -c "echo $HOME"'), '/home/user\n')
      await assert.rejects(sbx.commands.run('sudo sh -c "exit 9"', { user: 'user' }), (e) =>
        e instanceof CommandExitError && e.exitCode === 9)
      assert.match(await run('node -p process.version'), /^v26\./)
      assert.match(await run('npm --version'), /^12\./)
    })
  }
  await check('files: binary round trip', async () => {
    const blob = new Uint8Array(3 * 1024 * 1024).map((_, i) => (i * 7) & 0xff)
    await sbx.files.write('/tmp/node.bin', blob.buffer)
    const back = await sbx.files.read('/tmp/node.bin', { format: 'bytes' })
    assert.equal(Buffer.compare(Buffer.from(back), Buffer.from(blob)), 0)
  })
  await check('files write/read', async () => {
    await sbx.files.write('/tmp/node.txt', 'from node')
    assert.equal(await sbx.files.read('/tmp/node.txt'), 'from node')
  })
  await check('getMetrics: sampled CPU and memory', async () => {
    await sbx.commands.run('timeout 6 sh -c "while :; do :; done" || true')
    let metrics = []
    for (let i = 0; i < 40 && metrics.length < 2; i++) {
      metrics = await sbx.getMetrics()
      if (metrics.length < 2) await new Promise((r) => setTimeout(r, 500))
    }
    assert.ok(metrics.length >= 2, `metrics: ${JSON.stringify(metrics)}`)
    const last = metrics[metrics.length - 1]
    assert.ok(last.cpuCount >= 1)
    assert.ok(last.memTotal > 0 && last.memUsed > 0, JSON.stringify(last))
    assert.ok(last.timestamp instanceof Date)
  })
  await check('errors: timeout, killed mid-stream, connect to a killed sandbox', async () => {
    const s = await Sandbox.create(template, { timeoutMs: 120_000 })
    await assert.rejects(s.commands.run('sleep 5', { timeoutMs: 1000 }), (e) => e instanceof TimeoutError)
    setTimeout(() => Sandbox.kill(s.sandboxId), 1000)
    const t = Date.now()
    await assert.rejects(s.commands.run('sleep 30', { timeoutMs: 60_000 }), (e) => {
      assert.ok(e instanceof Error, String(e))
      return true
    })
    assert.ok(Date.now() - t < 20_000, 'the stream ends when the sandbox is killed')
    await assert.rejects(Sandbox.connect(s.sandboxId), (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError)
  })
  await check('list', async () => {
    const items = await Sandbox.list({ query: { metadata: { suite: 'node' } } }).nextItems()
    assert.deepEqual(items.map((s) => s.sandboxId), [sbx.sandboxId])
  })
  await check('kill', async () => {
    await sbx.kill()
    assert.equal(await sbx.isRunning(), false)
    const items = await Sandbox.list({ query: { metadata: { suite: 'node' } } }).nextItems()
    assert.deepEqual(items, [])
  })
  await check('bad key is 401', async () => {
    await assert.rejects(
      Sandbox.create(template, { apiKey: 'e2b_' + '0'.repeat(40) }),
      (e) => e instanceof AuthenticationError,
    )
  })
  await check('unknown sandbox is 404', async () => {
    await assert.rejects(Sandbox.getInfo('sc-0000000000000000'), (e) => e instanceof NotFoundError)
  })
}

main().catch((e) => {
  console.log(`FAIL ${e && e.stack ? e.stack : e}`)
  process.exitCode = 1
})
