from .pola import (compile_status, pola_attention, pola_attention_fast, pola_attention_reference,
                   polarity_feature_map, polarity_feature_map_and_mean)

__all__ = [
    'pola_attention', 'pola_attention_reference', 'pola_attention_fast', 'polarity_feature_map',
    'polarity_feature_map_and_mean', 'compile_status'
]
