"""Generators: fairseq has no generator registry, so each of our models names its generator class
(``model.generator_class``) and ``nat_translation.build_generator`` instantiates it."""
from .mask_predict import MaskPredictGenerator  # noqa: F401
from .ctc_nat import CTCGenerator  # noqa: F401
from .imputer import ImputerGenerator  # noqa: F401
from .nat_fertility import NPDGenerator  # noqa: F401
from .iterative_refinement import RefinementGenerator  # noqa: F401
from .da_transformer import DAGenerator  # noqa: F401
from .glat import GLATGenerator  # noqa: F401
