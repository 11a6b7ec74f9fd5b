import sys

from vllm_sparse_mla_blackwell.cli import main

sys.exit(main())
