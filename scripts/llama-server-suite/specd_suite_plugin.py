"""pytest plugin: runs llama.cpp's own server tests (tools/server/tests) offline on local models.

Loaded with `-p specd_suite_plugin` from run.sh. It changes how the suite obtains models, nothing
about what the tests check:
- every preset that would download a model from Hugging Face gets SUITE_MODEL instead;
- `download_file` (used for draft models) returns SUITE_DRAFT;
- the start-of-session preset download (`ServerPreset.load_all`) is skipped.
The same plugin and models are used for llama-server and for specd, so the two pass sets compare.
"""
import os

import utils

_MODEL = os.environ["SUITE_MODEL"]
_DRAFT = os.environ.get("SUITE_DRAFT", _MODEL)
_orig_start = utils.ServerProcess.start


def _start(self, *args, **kwargs):
    if self.model_hf_repo is not None or self.model_url is not None:
        self.model_file = _MODEL
        self.model_hf_repo = None
        self.model_hf_file = None
        self.model_url = None
    return _orig_start(self, *args, **kwargs)


utils.ServerProcess.start = _start
utils.ServerPreset.load_all = staticmethod(lambda: None)
utils.download_file = lambda url, output_file_path=None: _DRAFT
