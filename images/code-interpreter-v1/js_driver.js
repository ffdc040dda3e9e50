// The JavaScript kernel's node process (js_kernel.py starts one per context and keeps it):
// runs each cell in this process's global scope, so what one cell declares the next sees.
//
// Cells come as JSON lines on the fd SANDCELL_JS_CMD_FD names ({"code": ...}); each gets one
// JSON line back on SANDCELL_JS_REPLY_FD: {"status": "ok", "result": <util.inspect text or
// null>} or {"status": "error", "ename", "evalue", "traceback": [lines]}. stdout and stderr
// are the cell's own (console.log, process.stdout, child processes): pipes the kernel streams
// while the cell runs. The reply goes once node's own writes to them are done (a full pipe
// queues them), so all a cell printed is in its pipes before its reply.
//
// SIGINT interrupts the cell: its synchronous part through vm's breakOnSigint, a pending
// top-level await through the listener below. Code that loops after an await blocks this
// process for good; the kernel kills and restarts it then.
'use strict'
const fs = require('node:fs')
const net = require('node:net')
const path = require('node:path')
const readline = require('node:readline')
const util = require('node:util')
const vm = require('node:vm')
const { createRequire } = require('node:module')

const cmdFd = Number(process.env.SANDCELL_JS_CMD_FD)
const replyFd = Number(process.env.SANDCELL_JS_REPLY_FD)
delete process.env.SANDCELL_JS_CMD_FD
delete process.env.SANDCELL_JS_REPLY_FD

// Node's REPL rewrites top-level await (`let x = await f(); x` into an async function that
// assigns x and returns {value: x}); it is internal (--expose-internals, which
// js_kernel.py passes). Without it, an await cell runs as an async function with no result.
let processTopLevelAwait = null
try {
  ;({ processTopLevelAwait } = require('internal/repl/await'))
} catch {}

// What a cell sees besides node's globals: require, resolving from the context's cwd (as
// the REPL's does), and a module object for code written for CommonJS.
globalThis.require = createRequire(path.join(process.cwd(), '<cell>'))
globalThis.module = { exports: {} }

let cells = 0
// The running cell's interrupt (rejects its pending await), or null.
let interrupt = null

process.on('SIGINT', () => {
  if (interrupt) interrupt()
})
// A timer or promise of an earlier cell that throws must not end the context.
process.on('uncaughtException', (e) => console.error('Uncaught', e))
process.on('unhandledRejection', (e) => console.error('Unhandled rejection', e))

async function reply(obj) {
  // (an empty write's callback runs once the writes before it are in the pipe)
  for (const out of [process.stdout, process.stderr]) await new Promise((done) => out.write('', done))
  fs.writeSync(replyFd, JSON.stringify(obj) + '\n')
}

// (the message and code vm's breakOnSigint gives a synchronous part it stopped)
function interrupted() {
  const e = new Error('Script execution was interrupted by `SIGINT`')
  e.code = 'ERR_SCRIPT_EXECUTION_INTERRUPTED'
  return e
}

// A cell that starts with `{` is an object literal, as in node's REPL, when it compiles as
// one (`{a: 1}` would otherwise be a block with a label).
function objectLiteral(code) {
  if (!/^\s*\{/.test(code) || /;\s*$/.test(code)) return code
  try {
    new vm.Script(`(${code}\n)`)
    return `(${code}\n)`
  } catch {
    return code
  }
}

// The stack as the cell's frames: the driver's and node's own frames after them say nothing.
function traceback(e) {
  if (!(e instanceof Error) || typeof e.stack !== 'string') return [util.inspect(e)]
  return e.stack.split('\n').filter((l) => !/\(node:|at node:|js_driver\.js/.test(l))
}

async function run(code) {
  const filename = `<cell ${++cells}>`
  code = objectLiteral(code)
  let source = code
  let awaited = false
  if (/\bawait\b/.test(code)) {
    let rewritten = null
    try {
      // (the newline: a trailing // comment would swallow the wrapper's closing brackets)
      rewritten = processTopLevelAwait ? processTopLevelAwait(code + '\n') : `(async () => {\n${code}\n})()`
    } catch {} // not valid JavaScript: compiled as it is below, for the SyntaxError's position
    if (rewritten !== null) {
      source = rewritten
      awaited = true
    }
  }
  const script = new vm.Script(source, {
    filename,
    importModuleDynamically: vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER,
  })
  let value = script.runInThisContext({ breakOnSigint: true })
  if (awaited) {
    const stop = new Promise((_, reject) => {
      interrupt = () => reject(interrupted())
    })
    try {
      value = await Promise.race([value, stop])
    } finally {
      interrupt = null
    }
    value = processTopLevelAwait && value ? value.value : undefined
  }
  return value
}

async function main() {
  // (a socket, not fs.createReadStream: a thread pool read blocked on the pipe would keep
  // process.exit() in a cell from ending this process)
  const input = new net.Socket({ fd: cmdFd, readable: true, writable: false })
  const lines = readline.createInterface({ input })
  for await (const line of lines) {
    const { code } = JSON.parse(line)
    try {
      const value = await run(code)
      await reply({ status: 'ok', result: value === undefined ? null : util.inspect(value) })
    } catch (e) {
      const isError = e instanceof Error
      await reply({
        status: 'error',
        ename: isError ? e.name : 'Uncaught',
        evalue: isError ? e.message : util.inspect(e),
        traceback: traceback(e),
      })
    }
  }
  // The kernel closed its end: it is gone.
  process.exit(0)
}

main()
