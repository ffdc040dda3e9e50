// One named check of the node suites: prints `ok NAME` or `FAIL NAME: stack`, and a failure
// sets the exit code without stopping the checks after it.
async function check(name, fn) {
  try {
    await fn()
    console.log(`ok   ${name}`)
  } catch (e) {
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`)
    process.exitCode = 1
  }
}

module.exports = { check }
