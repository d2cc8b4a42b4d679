"""docs/configuration.md is generated from the settings object (docs/configuration_page.py):
it names every variable a setting reads with the default the worker really starts with."""

from __future__ import annotations

import importlib.util
import re

import pytest

from worker.settings import Settings, by_variable, env_name, load_settings

from support.paths import REPO

PAGE = REPO / "docs" / "configuration.md"
_spec = importlib.util.spec_from_file_location(
    "configuration_page", REPO / "docs" / "configuration_page.py"
)
assert _spec is not None and _spec.loader is not None
settings_doc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(settings_doc)


def test_the_page_is_the_generated_text() -> None:
    assert PAGE.read_text() == settings_doc.markdown(), (
        "docs/configuration.md differs from the settings object: regenerate it with "
        "`python docs/configuration_page.py > docs/configuration.md`"
    )


def rows() -> dict[str, list[str]]:
    found = {}
    for line in PAGE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        if line.startswith("| `") and len(cells) == 4:
            found[cells[0].strip("`")] = cells[1:]
    return found


def test_every_variable_has_one_row_with_its_real_default() -> None:
    """Against the values the worker starts with when no variable is set, not against the
    generator's own reading of the defaults."""
    table = rows()
    assert sorted(table) == sorted(env_name(name) for name in Settings.model_fields)
    effective = by_variable(load_settings(environ={}))
    in_words = set()
    for variable, (default, _accepts, meaning) in table.items():
        assert meaning, variable
        shown = re.fullmatch(r"`(.*)`", default)
        if shown:
            value = effective[variable]
            text = str(value).lower() if isinstance(value, bool) else str(value)
            assert shown.group(1) == text, variable
        elif default.startswith("unset"):
            assert effective[variable] is None, variable
        else:
            in_words.add(variable)
    # Defaults worked out at start-up, or a path: told in words, and only these.
    assert in_words == {
        "KP_MODEL_PATH",
        "KP_MODEL_SHA256",
        "KP_TOKENIZER_PATH",
        "KP_EMBED_CONCURRENCY",
    }


def test_a_setting_without_a_meaning_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    meanings = dict(settings_doc.MEANINGS)
    del meanings["cache_capacity"]
    monkeypatch.setattr(settings_doc, "MEANINGS", meanings)
    with pytest.raises(KeyError, match="cache_capacity"):
        settings_doc.markdown()
