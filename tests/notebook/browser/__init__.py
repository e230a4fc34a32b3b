"""Helpers of tests/notebook/test_browser.py: a JupyterLab server started for one test, and a
Playwright page driving a notebook in it with headless Chromium (lab.py)."""
