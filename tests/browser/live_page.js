// The live page in headless Chromium (Debian's, driven by playwright-core): the workload tree's
// nodes and a waiting query are in the DOM, and the figures change by themselves as the
// queries finish (no reload).
//
//   node live_page.js URL [SCREENSHOT.png]
//
// Prints one line per check; exits non-zero on the first that fails.
const { chromium } = require("playwright-core");

const [url, screenshot] = process.argv.slice(2);

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 820 } });
    await page.goto(url);
    // The tree: each workload a node, under its parent.
    for (const path of ["/all", "/all/prod", "/all/dev"]) {
      await page.waitForSelector(`section[data-resource="slots"] li.node[data-path="${path}"]`, { timeout: 10000 });
    }
    const nested = await page.$(`li.node[data-path="/all"] li.node[data-path="/all/prod"]`);
    if (!nested) throw new Error("prod is not drawn under all");
    console.log("tree: /all > /all/prod, /all/dev");
    // The shares table under the tree: prod's weight 3 against dev's 1 under all's one slot.
    const shares = {};
    for (const row of await page.$$(`table.shares[data-resource="slots"] tr.share`)) {
      shares[await row.getAttribute("data-workload")] = await row.$eval("td.guaranteed", (td) => td.textContent);
    }
    if (shares.prod !== "75%" || shares.dev !== "25%" || shares.all !== "100%") {
      throw new Error("shares: " + JSON.stringify(shares));
    }
    console.log("shares: all 100%, prod 75%, dev 25%");
    // The waiting query, with what it waits for.
    const waiting = await page.waitForSelector("tr.process.waiting", { timeout: 10000 });
    const text = await waiting.innerText();
    if (!text.includes("SELECT 42") || !text.includes("slots")) throw new Error("waiting row: " + text);
    console.log("waiting: SELECT 42 for slots");
    const queued = await page.getAttribute(`section[data-resource="slots"] li.node[data-path="/all/dev"]`, "data-queued");
    if (queued !== "1") throw new Error("dev queued " + queued);
    if (screenshot) await page.screenshot({ path: screenshot });
    // The test ends the running query when it reads this line.
    console.log("dev queued 1");
    // As the queries finish, the same page (no reload) shows it.
    const first = await page.getAttribute("body", "data-updated");
    await page.waitForFunction(() => !document.querySelector("tr.process"), null, { timeout: 60000 });
    await page.waitForFunction(() =>
      document.querySelector('section[data-resource="slots"] li.node[data-path="/all/dev"]').dataset.queued === "0",
      null, { timeout: 10000 });
    const last = await page.getAttribute("body", "data-updated");
    if (!(Number(last) > Number(first))) throw new Error("not updated: " + first + " then " + last);
    console.log("after: nothing runs or waits, dev queued 0, updated in place");
  } finally {
    await browser.close();
  }
})().catch((e) => {
  console.error("FAILED: " + e.message);
  process.exit(1);
});
