// The registry `e2b` npm SDK's `Secret` class, unmodified, against a real `sandcell serve`
// (run through tests/e2b/run.sh: E2B_API_URL, E2B_API_KEY and SANDCELL_OTHER_KEY are set).
const assert = require('node:assert/strict')
const { test } = require('node:test')
const crypto = require('node:crypto')
const { Secret, SecretNotFoundError } = require('e2b')

const VALUE = 'sk-js-' + crypto.randomUUID()
const OTHER = { apiKey: process.env.SANDCELL_OTHER_KEY }
const unique = (p) => `${p}-${crypto.randomUUID().slice(0, 8)}`

test('create, get, update, list, destroy', async () => {
  const name = unique('Js-Key')
  const info = await Secret.create(name, VALUE, { metadata: { owner: 'js' } })
  assert.ok(info.secretId.startsWith('sec_'), info.secretId)
  assert.equal(info.name, name.toLowerCase())
  assert.equal(info.version, 1)
  assert.deepEqual(info.metadata, { owner: 'js' })
  assert.ok(info.createdAt instanceof Date)

  assert.equal((await Secret.getInfo(name.toUpperCase())).secretId, info.secretId)
  const updated = await Secret.update(info.secretId, VALUE + '-2')
  assert.equal(updated.version, 2)
  assert.deepEqual(updated.metadata, { owner: 'js' })

  const seen = []
  const paginator = Secret.list({ limit: 1 })
  while (paginator.hasNext) {
    const page = await paginator.nextItems()
    assert.ok(page.length <= 1)
    seen.push(...page.map((s) => s.secretId))
  }
  assert.ok(seen.includes(info.secretId))

  assert.equal(await Secret.exists(name, OTHER), false)
  await assert.rejects(Secret.update(info.secretId, 'stolen', OTHER), SecretNotFoundError)
  assert.equal(await Secret.destroy(name, OTHER), false)

  assert.equal(await Secret.destroy(name), true)
  assert.equal(await Secret.exists(info.secretId), false)
  await assert.rejects(Secret.getInfo(name), SecretNotFoundError)
})
