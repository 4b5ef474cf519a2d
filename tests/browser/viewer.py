"""The viewer in real headless Chromium (Debian's chromium + chromium-driver, Selenium).

usage: viewer.py BASE_URL TOKEN HOSTILE_TRACE_ID HOSTILE_REFERENCE

1. signs in with the token at /login;
2. on the search page, filters PARSE failures of search_docs (typing the tool, choosing the
   stage and the error type: the page's script submits on change), opens the first call;
3. on its trace page, sees the failed parse stage (red, selected without clicking), the
   call's attempts side by side and its arguments;
4. opens the call's reference URL and lands on the span carrying that reference;
5. opens the hostile trace: every payload renders as text, no script runs, no dialog opens;
6. the browser console shows no error on any page (a CSP violation would be one).
Exits non-zero with a message on the first failed check.
"""

import sys
import urllib.parse

from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

BASE, TOKEN, HOSTILE, HOSTILE_REF = sys.argv[1:5]


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def driver():
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.binary_location = "/usr/bin/chromium"
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def console_errors(d):
    return [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]


def no_console_errors(d, page):
    errs = console_errors(d)
    check(not errs, f"no console errors on {page}: {errs}")


def no_dialog(d, page):
    try:
        d.switch_to.alert
        raise SystemExit(f"FAILED: a dialog opened on {page}")
    except NoAlertPresentException:
        print(f"ok: no dialog on {page}")


def main():
    d = driver()
    wait = WebDriverWait(d, 20)
    try:
        # 1. Sign in.
        d.get(BASE + "/")
        check("/login" in d.current_url, "an anonymous visit is sent to the login form")
        d.find_element(By.ID, "token").send_keys(TOKEN)
        d.find_element(By.CSS_SELECTOR, "form[action='/login'] button").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "form.filters"))
        no_console_errors(d, "search page")

        # 2. Filter PARSE failures of search_docs.
        tool = d.find_element(By.NAME, "tool")
        tool.clear()
        tool.send_keys("search_docs")
        Select(d.find_element(By.NAME, "stage")).select_by_value("parse")  # submits
        wait.until(lambda d: "stage=parse" in d.current_url)
        Select(d.find_element(By.NAME, "error_type")).select_by_value("PARSE")
        wait.until(lambda d: "error_type=PARSE" in d.current_url)
        q = urllib.parse.parse_qs(urllib.parse.urlparse(d.current_url).query)
        check(q.get("tool") == ["search_docs"], f"the tool filter is kept: {d.current_url}")
        rows = d.find_elements(By.CSS_SELECTOR, "table.calls tbody tr")
        check(len(rows) > 0, f"{len(rows)} failed calls listed")
        for r in rows:
            cells = r.find_elements(By.TAG_NAME, "td")
            check(cells[1].text == "search_docs" and "PARSE" in cells[3].text,
                  f"row is a PARSE failure of search_docs: {cells[1].text} {cells[3].text}")
        facet = d.find_element(By.CSS_SELECTOR, "ul.type-counts a.on").text
        check(facet.startswith("PARSE"), f"the PARSE facet is on: {facet}")
        reference = rows[0].find_elements(By.TAG_NAME, "td")[7].text
        no_console_errors(d, "filtered search page")

        # 3. Open the first call.
        rows[0].find_element(By.CSS_SELECTOR, "a.open").click()
        wait.until(lambda d: d.find_elements(By.ID, "detail"))
        check("/traces/" in d.current_url, "the row opens its trace")
        failed_parse = d.find_elements(
            By.XPATH, "//table[contains(@class,'waterfall')]//tr[contains(@class,'failed')]"
                      "[.//span[contains(@class,'stage') and text()='parse']]")
        check(failed_parse and failed_parse[0].is_displayed(),
              "the failed parse stage is visible in the waterfall without clicking")
        check(failed_parse[0].find_elements(By.CSS_SELECTOR, ".errline"),
              "its error message is shown inline")
        attempts = d.find_elements(By.CSS_SELECTOR, "table.attempts")
        check(attempts, "the call's attempts are shown side by side")
        cols = attempts[0].find_elements(By.CSS_SELECTOR, "tr:first-child th")
        check(len(cols) >= 2, f"{len(cols) - 1} attempt column(s)")
        # Select the call (its row in the waterfall) to see its arguments.
        d.find_element(By.CSS_SELECTOR, "section.call h3 a").click()
        wait.until(lambda d: "span=" in d.current_url)
        detail = d.find_element(By.ID, "detail")
        check("Arguments" in detail.text, "the call's arguments are shown")
        check(detail.find_elements(By.CSS_SELECTOR, "pre.payload"), "as stored")
        no_console_errors(d, "trace page")

        # Folding a subtree hides its rows (the page's script).
        fold = d.find_element(By.CSS_SELECTOR, "button.fold")
        row = fold.find_element(By.XPATH, "ancestor::tr")
        nxt = row.find_element(By.XPATH, "following-sibling::tr[1]")
        fold.click()
        check(not nxt.is_displayed(), "folding hides the children")
        fold.click()
        check(nxt.is_displayed(), "unfolding shows them again")

        # 4. The reference URL lands on the span that carries it.
        if reference:
            d.get(BASE + "/r/" + urllib.parse.quote(reference))
            wait.until(lambda d: d.find_elements(By.ID, "detail"))
            detail = d.find_element(By.ID, "detail")
            span = detail.get_attribute("data-span")
            check("span=" + span in d.current_url, f"the reference selects span {span}")
            check(reference in detail.text, f"the selected span carries {reference}")
            selected = d.find_element(By.CSS_SELECTOR, "tr.selected")
            check(selected.get_attribute("id") == "span-" + span, "and its row is marked")
            no_console_errors(d, "reference page")
        # The search box takes a reference too.
        box = d.find_element(By.ID, "ref")
        box.send_keys(HOSTILE_REF)
        box.submit()
        wait.until(lambda d: HOSTILE in d.current_url)
        check("span=a000000000000004" in d.current_url,
              "the lookup box opens the span with the exception frames")

        # 5. The hostile trace renders as text; nothing runs.
        d.get(f"{BASE}/traces/{HOSTILE}")
        wait.until(lambda d: d.find_elements(By.ID, "detail"))
        pwned = d.execute_script("return window.__pwned === undefined ? null : window.__pwned")
        check(pwned is None, f"no injected script ran (window.__pwned = {pwned!r})")
        no_dialog(d, "hostile trace")
        text = d.find_element(By.TAG_NAME, "body").text
        for needle in ("<script>window.__pwned='frames'</script>",
                       "<img src=x onerror=\"window.__pwned='name'\">",
                       "JSONDecodeError<script>window.__pwned='etype'</script>",
                       "<html><script>window.__pwned='result'</script></html>"):
            check(needle in text, f"shown as text: {needle}")
        check(not d.find_elements(By.CSS_SELECTOR, "main script, main img, main iframe"),
              "no element was injected")
        d.get(f"{BASE}/traces/{HOSTILE}?span=a000000000000002")
        wait.until(lambda d: d.find_elements(By.ID, "detail"))
        text = d.find_element(By.ID, "detail").text
        check("{\"query\": \"<script>window.__pwned='args'</script>\"}" in text,
              "arguments with a script show as text")
        check("<svg onload=" in text, "attributes with markup show as text")
        pwned = d.execute_script("return window.__pwned === undefined ? null : window.__pwned")
        check(pwned is None, "still nothing ran")
        no_dialog(d, "hostile call")
        no_console_errors(d, "hostile trace")

        # The tool page.
        d.get(BASE + "/tools/search_docs")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "section.rates"))
        check(d.find_elements(By.CSS_SELECTOR, "svg.chart.rates circle"), "failure rates are charted")
        no_console_errors(d, "tool page")
    finally:
        d.quit()


if __name__ == "__main__":
    main()
