"""pytest plugin: runs llama.cpp's own server tests (tools/server/tests) offline on local models.

Loaded with `-p specd_suite_plugin` from run.sh. It changes how the suite obtains models, nothing
about what the tests check:
- every preset that would download a model from Hugging Face gets SUITE_MODEL instead;
- `download_file` (used for draft models) returns SUITE_DRAFT;
- the start-of-session preset download (`ServerPreset.load_all`) is skipped;
- with SUITE_FIM_MODEL set, the tests of unit/test_infill.py get that model (one with FIM tokens,
  e.g. a test model from `specd make-test-model`): SUITE_MODEL may have none.
The same plugin and models are used for llama-server and for specd, so the two pass sets compare.
"""
import os

import utils

_MODEL = os.environ["SUITE_MODEL"]
_DRAFT = os.environ.get("SUITE_DRAFT", _MODEL)
_FIM_MODEL = os.environ.get("SUITE_FIM_MODEL")
_orig_start = utils.ServerProcess.start


def _start(self, *args, **kwargs):
    if self.model_hf_repo is not None or self.model_url is not None:
        self.model_file = _MODEL
        if _FIM_MODEL and "test_infill.py" in os.environ.get("PYTEST_CURRENT_TEST", ""):
            self.model_file = _FIM_MODEL
        self.model_hf_repo = None
        self.model_hf_file = None
        self.model_url = None
    return _orig_start(self, *args, **kwargs)


utils.ServerProcess.start = _start
utils.ServerPreset.load_all = staticmethod(lambda: None)
utils.download_file = lambda url, output_file_path=None: _DRAFT
