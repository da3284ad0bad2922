// Shared by the pages the browser tests drive (kernel-test.html, model-test.html): run the
// page's work once and POST what it returns, or the error it threw, to the test's /result.
// Each progress line also goes to the test's /log, which prints it: a page that hangs in CI
// shows its last step there.
const log = (s) => {
  document.getElementById('log').textContent = s;
  fetch('/log', { method: 'POST', body: String(s).slice(0, 400) }).catch(() => {});
};
addEventListener('unhandledrejection', (e) => log(`unhandled rejection: ${e.reason}`));
addEventListener('error', (e) => log(`error: ${e.message}`));

async function report(obj) {
  document.getElementById('log').textContent = JSON.stringify(obj).slice(0, 400);
  await fetch('/result', { method: 'POST', body: JSON.stringify(obj) });
}

export async function runTest(work) {
  try {
    if (!navigator.gpu) throw new Error('WebGPU is not available in this browser');
    await report({ ok: true, ...(await work(log)) });
  } catch (e) {
    await report({ ok: false, error: String((e && e.message) || e) });
  }
}
