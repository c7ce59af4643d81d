// E2B's JavaScript SDK (npm `e2b`, unchanged) against loom: run by
// tests/docker/e2b/test_js_sdk.py from a directory whose node_modules has the pinned SDK,
// with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at loom.
//
// Each step is tried in turn and reported, its error said rather than thrown, and the
// sandbox is killed whatever happened; the last line of stdout is one JSON object:
//   {"create": {"ok", "value" | "error"}, "command": ..., "write": ..., "read": ...,
//    "kill": ..., "killAgain": ...}
import { Sandbox } from 'e2b'

const report = {}

async function step(name, fn) {
  try {
    report[name] = { ok: true, value: await fn() }
  } catch (e) {
    report[name] = { ok: false, error: `${e?.name ?? 'Error'}: ${e?.message ?? e}` }
  }
  return report[name]
}

const created = await step('create', async () => {
  const sbx = await Sandbox.create()
  return { sandboxId: sbx.sandboxId, sbx }
})
if (created.ok) {
  const { sbx } = created.value
  created.value = { sandboxId: sbx.sandboxId }
  await step('command', async () => {
    const r = await sbx.commands.run('echo "hello from $WHO" && echo to-stderr >&2', { envs: { WHO: 'js' } })
    return { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode }
  })
  await step('write', async () => {
    const info = await sbx.files.write('/home/user/from_js.txt', 'written by the JS SDK')
    return { path: info.path, name: info.name }
  })
  await step('read', async () => await sbx.files.read('/home/user/from_js.txt'))
  await step('kill', async () => await sbx.kill())
  // Killed: the control plane finds it no more (E2B's kill answers false for that).
  await step('killAgain', async () => await Sandbox.kill(sbx.sandboxId))
}
console.log(JSON.stringify(report))
