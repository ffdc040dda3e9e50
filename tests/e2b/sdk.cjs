// The registry `e2b` npm SDK, unmodified, against a real `sandcell serve` (run by
// tests/e2b/run.sh, which sets E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, SANDCELL_TEMPLATE
// and NODE_PATH). Exits non-zero on the first failed check.
const assert = require('node:assert/strict')
const { Sandbox, AuthenticationError, NotFoundError } = require('e2b')

const template = process.env.SANDCELL_TEMPLATE

async function check(name, fn) {
  try {
    await fn()
    console.log(`ok   ${name}`)
  } catch (e) {
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`)
    process.exitCode = 1
  }
}

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
  await check('files write/read', async () => {
    await sbx.files.write('/tmp/node.txt', 'from node')
    assert.equal(await sbx.files.read('/tmp/node.txt'), 'from node')
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
