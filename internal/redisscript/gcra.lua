return redis.error_reply('sluice: gcra is not written yet')
