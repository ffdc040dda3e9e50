// The registry `@e2b/desktop` npm SDK, unmodified, against a real `sandcell serve` and the
// installed `desktop` template. Run by tests/e2b/run.sh (E2B_API_URL, E2B_SANDBOX_URL,
// E2B_API_KEY, NODE_PATH) after the Python desktop suite. Every call is the SDK's own; each
// check reads back what the desktop did: the screen's pixels, the pointer, the file an
// application saved after the SDK typed into it, the VNC server's security types.
// Exits non-zero on a failed check.
const assert = require('node:assert/strict')
const zlib = require('node:zlib')
const { Sandbox } = require('@e2b/desktop')

const { check } = require('./check.cjs')

// (width, height, distinct colours in every 16th row) of an 8-bit RGB(A) PNG.
function pngSizeAndColours(png) {
  const buf = Buffer.from(png)
  assert.ok(buf.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])))
  let pos = 8
  let head = null
  const idat = []
  while (pos < buf.length) {
    const n = buf.readUInt32BE(pos)
    const kind = buf.toString('latin1', pos + 4, pos + 8)
    const body = buf.subarray(pos + 8, pos + 8 + n)
    if (kind === 'IHDR') head = { w: body.readUInt32BE(0), h: body.readUInt32BE(4), depth: body[8], type: body[9] }
    else if (kind === 'IDAT') idat.push(body)
    pos += 12 + n
  }
  assert.ok(head && head.depth === 8 && (head.type === 2 || head.type === 6), JSON.stringify(head))
  const bpp = head.type === 2 ? 3 : 4
  const raw = zlib.inflateSync(Buffer.concat(idat))
  const stride = 1 + head.w * bpp
  const colours = new Set()
  let prev = Buffer.alloc(head.w * bpp)
  for (let y = 0; y < head.h; y++) {
    const filter = raw[y * stride]
    const line = Buffer.from(raw.subarray(y * stride + 1, (y + 1) * stride))
    for (let i = 0; i < line.length; i++) { // undo the row filter (PNG spec, section 9)
      const a = i >= bpp ? line[i - bpp] : 0
      const b = prev[i]
      const c = i >= bpp ? prev[i - bpp] : 0
      let add = 0
      if (filter === 1) add = a
      else if (filter === 2) add = b
      else if (filter === 3) add = (a + b) >> 1
      else if (filter === 4) {
        const p = a + b - c
        const pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c)
        add = pa <= pb && pa <= pc ? a : pb <= pc ? b : c
      }
      line[i] = (line[i] + add) & 255
    }
    if (y % 16 === 0) {
      for (let i = 0; i < line.length; i += bpp) colours.add((line[i] << 16) | (line[i + 1] << 8) | line[i + 2])
    }
    prev = line
  }
  return { width: head.w, height: head.h, colours: colours.size }
}

async function waitFor(what, probe, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    try {
      if (await probe()) return
    } catch (e) {
      // not there yet (xdotool exits 1 while it finds no window)
    }
    await new Promise((r) => setTimeout(r, 500))
  }
  throw new Error(`${what} did not happen within ${timeoutMs / 1000} s`)
}

// The security types the VNC server on 5900 offers after the RFB 3.8 version exchange, read
// inside the sandbox (1: none, 2: VNC password).
const RFB_SECURITY = `python3 -c "
import socket
s = socket.create_connection(('127.0.0.1', 5900))
s.recv(12)
s.sendall(b'RFB 003.008\\n')
n = s.recv(1)[0]
print(list(s.recv(n)))
"`

async function main() {
  // The SDK's default template: desktop.
  const sbx = await Sandbox.create({ timeoutMs: 600_000 })
  try {
    await check('the screen is a painted desktop of the asked size', async () => {
      assert.deepEqual(await sbx.getScreenSize(), { width: 1024, height: 768 })
      await waitFor('the desktop painted', async () => {
        const seen = pngSizeAndColours(await sbx.screenshot())
        assert.deepEqual([seen.width, seen.height], [1024, 768])
        return seen.colours > 50
      })
    })
    await check('the pointer goes where it is sent', async () => {
      await sbx.moveMouse(321, 234)
      assert.deepEqual(await sbx.getCursorPosition(), { x: 321, y: 234 })
      await sbx.moveMouse(10, 700)
      assert.deepEqual(await sbx.getCursorPosition(), { x: 10, y: 700 })
    })
    await check('an application opens a file and saves what the SDK typed', async () => {
      await sbx.files.write('/home/user/node-note.txt', '')
      await sbx.open('/home/user/node-note.txt')
      let window = null
      await waitFor("mousepad's window", async () => {
        window = (await sbx.getApplicationWindows('mousepad'))[0]
        return window
      })
      assert.match(await sbx.getWindowTitle(window), /node-note\.txt/)
      await waitFor('mousepad focused', async () => (await sbx.getCurrentWindowId()) === window, 10_000)
      await sbx.write('typed by the npm SDK')
      await sbx.press(['ctrl', 's'])
      await waitFor(
        'the saved file',
        async () => (await sbx.files.read('/home/user/node-note.txt')) === 'typed by the npm SDK',
        15_000,
      )
    })
    await check('a stream with requireAuth asks VNC clients for the password in its URL', async () => {
      await sbx.stream.start({ requireAuth: true })
      try {
        const key = sbx.stream.getAuthKey()
        assert.ok(key.length >= 8, key)
        const url = new URL(sbx.stream.getUrl({ authKey: key }))
        assert.equal(url.pathname, '/vnc.html')
        assert.equal(url.searchParams.get('password'), key)
        const page = await sbx.commands.run('curl -sf http://127.0.0.1:6080/vnc.html')
        assert.match(page.stdout, /noVNC/)
        assert.equal((await sbx.commands.run(RFB_SECURITY)).stdout.trim(), '[2]')
      } finally {
        await sbx.stream.stop()
      }
    })
  } finally {
    await sbx.kill()
  }
}

main().catch((e) => {
  console.log(`FAIL desktop.cjs: ${e && e.stack ? e.stack : e}`)
  process.exitCode = 1
})
