"""Run `fusionrag bench quality` with VARIANT_BLEND set to argv[1] (an ablation, not an option)."""
import sys

import fusionrag_llm.engine.variant_choice as variant_choice

variant_choice.VARIANT_BLEND = float(sys.argv[1])
from fusionrag_llm.cli.main import main  # noqa: E402

sys.argv = ["fusionrag", *sys.argv[2:]]
main()
