"""The chat settings' grammar box: the `grammar` row the parameter table gives every conversation
(a JSON schema the reply must match, or a Lark grammar), typed and read back as written."""
from __future__ import annotations

import json

import pytest

from engine import params as P

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_a_conversation_takes_a_schema_and_refuses_broken_json(qtbot):
    from ui.param_form import ConversationDialog
    d = ConversationDialog(None, "", P.defaults("sampling"))
    qtbot.addWidget(d)
    box = d.form.editors["grammar"]
    assert box.text() == "" and d.form.values()["grammar"] is None  # free text by default
    box.setText(json.dumps(SCHEMA))
    assert json.loads(d.form.values()["grammar"]) == SCHEMA
    box.setText('start: "yes" | "no"')
    assert d.form.values()["grammar"] == 'start: "yes" | "no"'
    box.setText('{"type": "object",')
    with pytest.raises(ValueError, match="grammar"):
        d.form.values()
    d.form.set_value("grammar", None)
    assert d.form.values()["grammar"] is None
