"""Print torch's include dirs ('|'-separated), library dir and C++ ABI flag, one per line.

Used by CMakeLists.txt so the op module builds against the torch already installed
(``pip install --no-build-isolation``) without torch's CMake package.
"""

import torch
from torch.utils import cpp_extension

print("|".join(cpp_extension.include_paths()))
print(cpp_extension.library_paths()[0])
print(int(torch.compiled_with_cxx11_abi()))
