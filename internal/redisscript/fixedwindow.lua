return redis.error_reply('sluice: fixedwindow is not written yet')
