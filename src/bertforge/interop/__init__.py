"""Hugging Face and sentence-transformers directories: reading, writing and inspecting them.

The models know nothing of files; importing this package plugs its reader and writer into them, so
that `BertModel.from_pretrained(dir)` and `model.save_pretrained(dir)` work as in transformers.
"""

from ..models.base import install_checkpoint_io
from . import hf

install_checkpoint_io(hf)
