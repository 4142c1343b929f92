package nvmlowner
