"""The paths the README and docs/ name in the example project (``src/``, ``configs/experiment/``,
``tests/examples/``) exist (the rest of each page: tests/test_docs.py)."""

from __future__ import annotations

import pytest

from tests.test_docs import PAGES, ROOT, page_problems


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_and_path_a_page_names_in_the_example_project_exists(page):
    problems = page_problems(page, examples=True)
    assert not problems, "\n".join(problems)
