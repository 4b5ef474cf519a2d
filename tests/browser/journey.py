"""A new user's first half hour in the viewer, in real headless Chromium (Selenium), on the
data of a `toolspan demo` run that is still serving.

usage: journey.py BASE_URL SCREENSHOT_DIR

1. opens the viewer (the search page);
2. filters PARSE failures of search_docs (typing the tool, choosing the stage and the error
   type: the page's script submits on change); every row is one;
3. opens the first: the page opens on the failed call, "What failed" is in view without
   clicking, with the failing stage, the error, what the model received (result, leak,
   size, sha256) and the arguments it sent;
4. follows the call's reference: the page lands with "What failed" in view, the span
   carrying the reference selected;
5. opens the tool page from there, over the last 15 minutes: the failure-rate chart is not
   flat, and every point of its parse line equals what SQL over `failure_rates` answers for
   the same minutes (within rounding);
6. opens update_ticket's page and its "compare 1.4.2 → 1.5.0" link for support-bot: the
   compare page says 1.5.0 is better on recovery, with the figures of /api/v1/compare;
7. no page logs a console error (a Content-Security-Policy violation would be one).
A screenshot of every page goes to SCREENSHOT_DIR. Exits non-zero on the first failed check.
"""

import json
import os
import sys
import tempfile
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

BASE, SHOTS = sys.argv[1:3]
BASE = BASE.rstrip("/")  # the URL as the demo printed it


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def driver(profile):
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--disable-background-networking", "--disable-component-update",
              "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
              "--window-size=1500,1100"):
        opts.add_argument(a)
    opts.binary_location = "/usr/bin/chromium"
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def sql(statement):
    req = urllib.request.Request(
        BASE + "/api/v1/sql", data=json.dumps({"sql": statement}).encode(),
        headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["rows"]


def api(path):
    with urllib.request.urlopen(BASE + path, timeout=30) as r:
        return json.loads(r.read())


def shot(d, name):
    path = os.path.join(SHOTS, name + ".png")
    d.save_screenshot(path)
    print(f"screenshot: {path}")


def no_console_errors(d, page):
    errs = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]
    check(not errs, f"no console errors on {page}: {errs}")


def in_view(d, el):
    top, bottom = d.execute_script(
        "var r = arguments[0].getBoundingClientRect(); return [r.top, r.bottom];", el)
    height = d.execute_script("return window.innerHeight;")
    return 0 <= top < height and bottom > 0


def main():
    os.makedirs(SHOTS, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="toolspan-journey-chromium-")
    d = driver(profile)
    wait = WebDriverWait(d, 30)
    try:
        # 1. The viewer.
        d.get(BASE + "/")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "form.filters"))
        check(d.find_elements(By.CSS_SELECTOR, "svg.chart.rates"), "the search page charts the range")
        shot(d, "01-search")
        no_console_errors(d, "search page")

        # 2. PARSE failures of search_docs.
        tool = d.find_element(By.NAME, "tool")
        tool.clear()
        tool.send_keys("search_docs")
        Select(d.find_element(By.NAME, "stage")).select_by_value("parse")  # submits
        wait.until(lambda d: "stage=parse" in d.current_url)
        Select(d.find_element(By.NAME, "error_type")).select_by_value("PARSE")
        wait.until(lambda d: "error_type=PARSE" in d.current_url)
        rows = d.find_elements(By.CSS_SELECTOR, "table.calls tbody tr")
        check(len(rows) > 0, f"{len(rows)} PARSE failures of search_docs listed")
        for r in rows:
            cells = r.find_elements(By.TAG_NAME, "td")
            check(cells[1].text == "search_docs" and "PARSE" in cells[3].text,
                  f"row is a PARSE failure of search_docs: {cells[1].text} {cells[3].text}")
        shot(d, "02-search-parse-failures")
        no_console_errors(d, "filtered search page")

        # 3. Open one (with a reference, to follow it next): the page opens on the failed call.
        with_ref = [r for r in rows if r.find_elements(By.TAG_NAME, "td")[7].text.strip()]
        check(with_ref, "a failure with an error reference")
        with_ref[0].find_element(By.CSS_SELECTOR, "a.open").click()
        wait.until(lambda d: d.find_elements(By.ID, "what-failed"))
        panel = d.find_element(By.ID, "what-failed")
        check(in_view(d, panel), "What failed is in view without scrolling or clicking")
        text = panel.text
        check("What failed" in text and "What the model received" in text, "both halves shown")
        check("PARSE" in panel.find_element(By.CSS_SELECTOR, "dd.error-type").text, "the error type")
        check(panel.find_elements(By.XPATH, ".//p[contains(@class,'stage')]"
                                  "//span[contains(@class,'stage') and text()='parse']"),
              "the failing stage is parse")
        message = panel.find_element(By.CSS_SELECTOR, "dd.message").text
        check(message, f"the error message: {message}")
        detail = d.find_element(By.ID, "detail")
        call_span = detail.get_attribute("data-span")
        stored = sql(f"SELECT output, output_sha256, input, output_bytes, leaked_internals "
                     f"FROM spans WHERE span_id = '{call_span}' AND stage = 'call'")
        check(len(stored) == 1, f"the selected span {call_span} is the call")
        result = panel.find_element(By.CSS_SELECTOR, ".received .result pre.payload").text
        check(result.strip() == (stored[0]["output"] or "").strip(),
              f"what the model received is the call's stored result: {result[:80]}")
        check(stored[0]["output_sha256"][:16] in panel.find_element(By.CSS_SELECTOR, ".received .result").text,
              "with its sha256")
        leak = "leaked internals to the model" if stored[0]["leaked_internals"] else "no internals leaked"
        check(leak in text, f"and whether it leaked: {leak}")
        args = panel.find_element(By.CSS_SELECTOR, ".received .arguments pre.payload").text
        check(args.strip() == (stored[0]["input"] or "").strip(), f"the arguments it sent: {args[:80]}")
        shot(d, "03-trace-what-failed")
        no_console_errors(d, "trace page")

        # 4. Follow its reference.
        ref_link = panel.find_element(By.CSS_SELECTOR, "dd.reference a")
        reference = ref_link.text
        ref_link.click()
        wait.until(lambda d: "#what-failed" in d.current_url)
        wait.until(lambda d: d.find_elements(By.ID, "what-failed"))
        panel = d.find_element(By.ID, "what-failed")
        check(in_view(d, panel), f"the reference {reference} lands with What failed in view")
        check(reference in panel.text, "the panel carries the reference")
        detail = d.find_element(By.ID, "detail")
        span = detail.get_attribute("data-span")
        check(f"span={span}" in d.current_url and reference in detail.text,
              f"the span carrying it ({span}) is selected")
        shot(d, "04-reference")
        no_console_errors(d, "reference page")

        # 5. The tool page, last 15 minutes.
        panel.find_element(By.CSS_SELECTOR, "p.call a[href^='/tools/']").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "svg.chart.rates"))
        since = d.find_element(By.NAME, "since")
        since.clear()
        since.send_keys("15m")
        since.submit()
        wait.until(lambda d: "since=15m" in d.current_url)
        points = d.find_elements(By.CSS_SELECTOR, "svg.chart.rates circle[data-stage='parse']")
        check(points, f"{len(points)} points of parse's failure rate")
        rates = [float(p.get_attribute("data-rate")) for p in points]
        check(max(rates) > 0, f"the chart is not flat: rates {rates}")
        width_s = int(d.find_element(By.CSS_SELECTOR, "svg.chart.rates").get_attribute("data-bucket-s"))
        for p in points:
            start = datetime.strptime(p.get_attribute("data-bucket"), "%Y-%m-%dT%H:%M:%SZ") \
                .replace(tzinfo=timezone.utc)
            end = start + timedelta(seconds=width_s)
            fmt = "%Y-%m-%dT%H:%M:%SZ"
            row = sql("SELECT sum(f) AS failures, sum(c) AS calls FROM ("
                      "SELECT minute, max(calls) AS c, sum(failures) AS f FROM failure_rates "
                      "WHERE tool = 'search_docs' AND stage = 'parse' "
                      f"AND minute >= TIMESTAMP '{start.strftime(fmt)}' "
                      f"AND minute < TIMESTAMP '{end.strftime(fmt)}' GROUP BY minute) t")[0]
            want = row["failures"] / row["calls"]
            got = float(p.get_attribute("data-rate"))
            check(abs(got - want) < 1e-3 and abs(float(p.get_attribute("data-spans")) - row["calls"]) < 0.5
                  and abs(float(p.get_attribute("data-failed")) - row["failures"]) < 0.5,
                  f"{start.strftime(fmt)}: chart {got:.4f} ({p.get_attribute('data-failed')}/"
                  f"{p.get_attribute('data-spans')}) = failure_rates {want:.4f} "
                  f"({row['failures']}/{row['calls']})")
        check(d.find_element(By.CSS_SELECTOR, "dd.latency .p95").text, "p95 latency shown")
        check(d.find_elements(By.CSS_SELECTOR, "table.codes a[href*='error_code=']"),
              "top error codes link to their calls")
        d.execute_script("document.querySelector('section.charts').scrollIntoView()")
        shot(d, "05-tool-search_docs")
        no_console_errors(d, "tool page")

        # 6. update_ticket: 1.4.2 vs 1.5.0 of support-bot.
        d.get(BASE + "/tools/update_ticket")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.versions"))
        link = d.find_element(By.XPATH, "//table[contains(@class,'versions')]//tr[td[1]='support-bot']"
                                        "//a[contains(@class,'compare')]")
        check("1.4.2" in link.text and "1.5.0" in link.text, f"a compare link: {link.text}")
        d.execute_script("arguments[0].scrollIntoView()", link)
        shot(d, "06-tool-update_ticket")
        link.click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.metrics"))
        row = d.find_element(By.CSS_SELECTOR, "table.metrics tr[data-metric='recovery_rate']")
        check(row.get_attribute("data-verdict") == "better", f"recovery: {row.text}")
        headline = d.find_element(By.CSS_SELECTOR, ".headline .better").text
        check(headline.startswith("1.5.0 is better on:") and "recovered from" in headline,
              f"the page says 1.5.0 is better on recovery: {headline}")
        c = api("/api/v1/compare?" + urllib.parse.urlencode(
            {"tool": "update_ticket", "service": "support-bot", "before": "1.4.2", "after": "1.5.0"}))
        m = next(m for m in c["metrics"] if m["metric"] == "recovery_rate")
        for side, cell in (("before", "td.before"), ("after", "td.after")):
            s = m[side]
            want = f"{s['value'] * 100:.1f}% ({s['count']}/{s['of']})"
            got = row.find_element(By.CSS_SELECTOR, cell).text
            check(got == want, f"{side}: page {got} = toolspan compare {want}")
        shot(d, "07-compare")
        no_console_errors(d, "compare page")
    finally:
        d.quit()


if __name__ == "__main__":
    main()
